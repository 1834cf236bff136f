"""The stand-in HTTP server: start-up sequence, endpoints, token pacing, faults.

Runs as ``python -m sglang_lab_standin <launch_server args>``.  Stdlib only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from . import SGLANG_VERSION, cli, logconfig, physics, textgen
from .faults import GARBAGE_RATE, HANG_AFTER_TOKENS, SLOW_TEXT_RATE, LabConfig, load_config

AUTH_EXEMPT_PREFIXES = ("/health", "/ready", "/metrics")
# Endpoints 0.5.23 marks @auth_level(AuthLevel.ADMIN_OPTIONAL) (entrypoints/http_server.py), a
# subset: open without keys; with only --api-key that key; with --admin-api-key only the admin key
# (srt/utils/auth.py decide_request_auth). The stand-in serves the first two; the others are
# decided like the real server and then answer 404 here.
ADMIN_OPTIONAL_PATHS = ("/flush_cache", "/update_weights_from_disk", "/set_internal_state", "/start_profile",
                        "/stop_profile", "/freeze_gc", "/update_weights_from_tensor", "/update_weight_version",
                        "/init_weights_update_group", "/update_weights_from_distributed")
SPECULATIVE_HOOK_LOGGER = "sglang.srt.arg_groups.speculative_hook"
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_print_lock = threading.RLock()  # re-entrant: the SIGTERM handler may run mid-log


def _ts() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def log(msg: str, tp: bool = False) -> None:
    prefix = f"[{_ts()} TP0] " if tp else f"[{_ts()}] "
    with _print_lock:
        for line in msg.splitlines() or [""]:
            sys.stdout.write(prefix + line + "\n")
        sys.stdout.flush()


def raw(msg: str) -> None:
    with _print_lock:
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()


def die(code: int) -> None:
    with _print_lock:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - we are exiting anyway
            pass
        os._exit(code)


def _gib(x: float) -> str:
    return f"{x:.2f}"


class Abort(Exception):
    """A request that must be answered with an error status."""

    def __init__(self, status: int, body: Any):
        super().__init__(status)
        self.status = status
        self.body = body


def step_sizes(n_tokens: int, accept_length: Optional[float], burst: int = 1) -> list:
    """How many new tokens each scheduler step (one stream event) carries, summing to n_tokens.

    Without speculative decoding every step adds one token.  With it, the prefill step adds one
    token and every verify step adds about ``accept_length`` (step j ends at token
    1 + floor(j * accept_length), so the mean is exact).  ``burst`` > 1: every step, the prefill
    one included, adds that many (the broken sm86 DDTREE tree verify).
    """
    if n_tokens <= 0:
        return []
    if burst > 1:
        sizes = [burst] * (n_tokens // burst)
        if n_tokens % burst:
            sizes.append(n_tokens % burst)
        return sizes
    if accept_length is None or accept_length <= 1.0:
        return [1] * n_tokens
    sizes, done, j = [1], 1, 0
    while done < n_tokens:
        j += 1
        end = 1 + int(math.floor(j * accept_length + 1e-9))
        size = min(end - done, n_tokens - done)
        if size > 0:
            sizes.append(size)
            done += size
    return sizes


def generation_crash_lines(b: physics.Behaviour) -> tuple:
    """The scheduler's traceback when the first generation hits Behaviour.first_request_crash."""
    return (("Scheduler hit an exception: Traceback (most recent call last):",)
            + physics._traceback([
                ("/opt/sglang/sglang/srt/managers/scheduler.py", 1298, "event_loop_overlap",
                 "batch_result = self.run_batch(batch)"),
                ("/opt/sglang/sglang/srt/speculative/dflash_worker_v2.py", 1929, "forward_batch_generation",
                 "ctx_hidden = self.draft_model.project_target_hidden(target_hidden)"),
                ("/opt/sglang/sglang/srt/models/dflash.py", 834, "project_target_hidden",
                 "raise ValueError(")],
                b.first_request_crash)[1:])


class LabEngine:
    """Shared state: readiness, admission control, pacing, counters."""

    def __init__(self, args, behaviour: physics.Behaviour, config: LabConfig, launch_command: str = ""):
        self.args = args
        self.launch_command = launch_command
        self.b = behaviour
        self.config = config
        self.fault = config.fault
        self.model_name = args.served_model_name or args.model_path or "default"
        self.cond = threading.Condition()
        self.running = 0
        self.queued = 0
        self.ready_at: Optional[float] = None
        self.warm = False
        # The tokenizer manager's server_status: "starting" until the warm-up returns, then "up";
        # "unhealthy" after a /health that got no scheduler answer (a later good one sets "up").
        self.status = "starting"
        self.stuck = False          # the scheduler stopped answering (hang_midstream)
        self.first_client_request_seen = False
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.last_gen_throughput = 0.0
        self.avg_accept_length: Optional[float] = None
        self.seen_prompts: set = set()
        self.generations = 0        # generations started (the server's own warm-up included)
        self.noise = random.Random(config.noise_seed)
        self.rate = self._rate()
        self.mode = self._mode()

    # ---- behaviour after faults -----------------------------------------------------------
    def _rate(self) -> float:
        if self.fault.kind == "garbage_fast":
            base = GARBAGE_RATE
        elif self.fault.kind == "slow_text":
            base = SLOW_TEXT_RATE
        else:
            base = self.b.tokens_per_second
        return base * self.config.rate_scale

    def _mode(self) -> str:
        if self.fault.kind == "garbage_fast":
            return "garbage"
        if self.fault.kind == "slow_text":
            return "correct"
        return "bang" if self.b.text_mode == "bang" else "correct"

    def divergence(self) -> tuple:
        """(diverge, after) for textgen.complete: how this server's free-form text leaves the
        target's (lossless_violation, near_tie_flip), else (None, 0)."""
        if self.fault.kind == "lossless_violation":
            return "confident", self.fault.tokens
        if self.fault.kind == "near_tie_flip":
            return "near_tie", 0
        return None, 0

    @property
    def speculative(self) -> bool:
        return self.b.accept_length is not None

    def healthy(self) -> bool:
        if not self.warm or self.fault.kind == "never_healthy":
            return False
        return not self.expired()

    def scheduler_answers(self) -> bool:
        """Would a one-token health generation get an answer from the scheduler now?"""
        return not self.stuck and not self.expired()

    def mark_ready(self) -> None:
        self.ready_at = time.monotonic()
        self.warm = True
        self.status = "up"

    def expired(self) -> bool:
        return (self.fault.kind == "unhealthy_after" and self.ready_at is not None
                and time.monotonic() - self.ready_at >= (self.fault.seconds or 0.0))

    # ---- admission --------------------------------------------------------------------------
    def admit(self) -> None:
        with self.cond:
            self.queued += 1
            try:
                while self.running >= self.b.max_running_requests:
                    self.cond.wait()
            finally:
                self.queued -= 1
            self.running += 1

    def release(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify()

    def stream_rate(self) -> float:
        running = max(1, self.running)
        return physics.per_stream_rate(self.rate, running) * physics.batch_factor(self.b, running)

    def request_factor(self) -> float:
        """This generation's rate factor: log-normal jitter (DDTREE_LAB_RATE_JITTER) times the cold
        factor for the first DDTREE_LAB_COLD_REQUESTS generations after start (docs/lab-physics.md)."""
        c = self.config
        with self.cond:
            n = self.generations
            self.generations += 1
            factor = self.noise.lognormvariate(0.0, c.rate_jitter) if c.rate_jitter else 1.0
        return factor * (c.cold_factor if n < c.cold_requests else 1.0)

    def ttft(self, prompt_tokens: int) -> float:
        return (0.01 + prompt_tokens / physics.PREFILL_TOKENS_PER_S) / self.config.rate_scale

    def cached_tokens(self, key: str, prompt_tokens: int) -> int:
        with self.cond:
            hit = key in self.seen_prompts
            self.seen_prompts.add(key)
        return max(0, prompt_tokens - 1) if hit else 0

    def record(self, prompt_tokens: int, completion_tokens: int, rate: float) -> None:
        with self.cond:
            self.requests_total += 1
            self.prompt_tokens_total += prompt_tokens
            self.generation_tokens_total += completion_tokens
            self.last_gen_throughput = rate * max(1, self.running)
            if self.speculative and completion_tokens:
                self.avg_accept_length = self.b.accept_length

    def draft_tokens(self) -> int:
        """speculative_num_draft_tokens: the flag, else what the family's accept rate implies."""
        n = getattr(self.args, "speculative_num_draft_tokens", None)
        if n:
            return int(n)
        rate = self.b.accept_rate or 0.0
        return max(2, int(round((self.b.accept_length - 1.0) / rate)) + 1) if rate else 2

    def spec_meta(self, completion_tokens: int) -> dict:
        """The finished request's speculative fields (tokenizer_manager adds them to the finished
        chunk only): accept length and rate are the physics' per-request means."""
        if not self.speculative:
            return {}
        verify_ct = int(math.ceil(completion_tokens / self.b.accept_length)) if completion_tokens else 0
        proposed = verify_ct * (self.draft_tokens() - 1)
        return {
            "spec_accept_rate": self.b.accept_rate,
            "spec_accept_length": self.b.accept_length,
            "spec_num_correct_drafts": int(round(self.b.accept_rate * proposed)),
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": verify_ct,
        }

    def step_sizes(self, n_tokens: int) -> list:
        """Tokens per stream event (one event per scheduler step) for a completion of n_tokens."""
        if self.b.text_mode == "bang":
            return step_sizes(n_tokens, None, burst=physics.BANG_BURST)
        return step_sizes(n_tokens, self.b.accept_length)

    def step_tokens(self) -> float:
        """Tokens one decode step is worth for pacing: step time = this / the stream's rate."""
        if self.b.text_mode == "bang":
            return float(physics.BANG_BURST)
        return self.b.accept_length if self.speculative and self.b.accept_length > 1 else 1.0

    def decode_log(self, tokens: int) -> None:
        accept = f"accept len: {self.b.accept_length:.2f}, " if self.speculative else ""
        usage = tokens / self.b.token_capacity if self.b.token_capacity else 0.0
        log(f"Decode batch, #running-req: {self.running}, #token: {tokens}, token usage: {usage:.2f}, "
            f"{accept}cuda graph: {self.b.cuda_graph_decode}, gen throughput (token/s): "
            f"{self.last_gen_throughput:.2f}, #queue-req: {self.queued}", tp=True)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    engine: LabEngine = None  # set by make_server

    # ---- plumbing ---------------------------------------------------------------------------
    def log_message(self, fmt, *a):  # silence the default stderr logger
        pass

    def access_log(self, status: int) -> None:
        host, port = self.client_address[:2]
        try:
            from http import HTTPStatus
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        raw(f'[{_ts()}] INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {status} {phrase}')

    def send_json(self, status: int, body: Any, extra_headers: Optional[dict] = None) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.access_log(status)

    def send_empty(self, status: int) -> None:
        """Starlette's Response(status_code=...): no body, no content-type."""
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("content-length", "0")
        self.end_headers()
        self.access_log(status)

    def send_text(self, status: int, text: str, ctype: str = "text/plain; charset=utf-8") -> None:
        data = text.encode("utf-8")
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.access_log(status)

    def start_stream(self) -> None:
        self.send_response_only(200)
        self.send_header("date", self.date_time_string())
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.access_log(200)

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def sse(self, obj: Any) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        self.chunk(f"data: {payload}\n\n".encode("utf-8"))

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def read_json(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        if not body:
            return {}
        try:
            return json.loads(body)
        except ValueError as exc:
            raise Abort(400, {"error": {"message": f"Invalid JSON body: {exc}"}}) from None

    def authorised(self, path: str) -> bool:
        """As 0.5.23's decide_request_auth for the NORMAL and ADMIN_OPTIONAL levels."""
        if path.startswith(AUTH_EXEMPT_PREFIXES):
            return True
        key, admin = self.engine.args.api_key, getattr(self.engine.args, "admin_api_key", None)
        if path in ADMIN_OPTIONAL_PATHS and admin:
            key = admin
        return not key or self.headers.get("authorization", "") == f"Bearer {key}"

    # ---- dispatch ---------------------------------------------------------------------------
    GET_ROUTES = {
        "/health": "health", "/health_generate": "health", "/ready": "ready",
        "/model_info": "model_info", "/get_model_info": "model_info",
        "/server_info": "server_info", "/get_server_info": "server_info",
        "/v1/models": "models", "/metrics": "metrics",
    }
    POST_ROUTES = {
        "/generate": "generate", "/v1/completions": "completions",
        "/v1/chat/completions": "chat",
        "/flush_cache": "flush_cache", "/update_weights_from_disk": "update_weights_from_disk",
    }

    def _dispatch(self, routes: dict) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if not self.authorised(path):
                self.read_json_quietly()
                return self.send_json(401, {"error": "Unauthorized"})
            name = routes.get(path)
            if name is None:
                self.read_json_quietly()
                other = self.POST_ROUTES if routes is self.GET_ROUTES else self.GET_ROUTES
                if path in other:
                    return self.send_json(405, {"detail": "Method Not Allowed"})
                if path == "/metrics" and not self.engine.args.enable_metrics:
                    return self.send_json(404, {"detail": "Not Found"})
                return self.send_json(404, {"detail": "Not Found"})
            getattr(self, "h_" + name)()
        except Abort as exc:
            self.send_json(exc.status, exc.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def read_json_quietly(self) -> None:
        try:
            length = int(self.headers.get("content-length") or 0)
            if length > 0:
                self.rfile.read(length)
        except (OSError, ValueError):
            pass

    def do_GET(self):  # noqa: N802
        self._dispatch(self.GET_ROUTES)

    def do_POST(self):  # noqa: N802
        self._dispatch(self.POST_ROUTES)

    # ---- simple endpoints ---------------------------------------------------------------------
    def h_health(self):
        """GET /health and /health_generate, as http_server.health_generate: 503 at once while
        starting; else a one-token generation, checked after each wait (1 s), 200 as soon as the
        scheduler answered, 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without an answer."""
        e = self.engine
        if e.status == "starting" or e.fault.kind == "never_healthy":
            return self.send_empty(503)
        cfg = e.config
        tic = time.monotonic()
        deadline = tic + cfg.health_timeout_seconds
        while True:
            time.sleep(max(0.0, min(cfg.health_wait_seconds, deadline - time.monotonic())))
            if e.scheduler_answers():
                e.status = "up"
                return self.send_empty(200)
            if time.monotonic() >= deadline - 1e-6:
                break
        log(f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{cfg.health_timeout_seconds:g} seconds. tic start time: "
            f"{datetime.now().strftime('%H:%M:%S')}.")
        e.status = "unhealthy"
        return self.send_empty(503)

    def h_ready(self):
        """GET /ready: 200 when the server status is up, else 503; no body either way."""
        e = self.engine
        up = e.status == "up" and e.fault.kind != "never_healthy"
        return self.send_empty(200 if up else 503)

    def model_info(self) -> dict:
        a = self.engine.args
        return {
            "model_path": a.model_path,
            "tokenizer_path": a.tokenizer_path or a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": physics.MODEL["model_type"],
            "architectures": [physics.MODEL["architecture"]],
        }

    def h_flush_cache(self):
        """POST /flush_cache: the stand-in has no radix cache to flush; it answers like a flush."""
        self.read_json_quietly()
        self.send_json(200, {"success": True, "message": "Cache flushed."})

    def h_update_weights_from_disk(self):
        """POST /update_weights_from_disk {"model_path": ...}: a runtime weight swap. The stand-in
        serves the same text afterwards but reports the new path (/model_info, /server_info)."""
        body = self.read_json()
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            raise Abort(400, {"success": False, "message": "model_path is required"})
        self.engine.args.model_path = path
        self.send_json(200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0})

    def h_model_info(self):
        self.send_json(200, self.model_info())

    def h_server_info(self):
        # As sglang 0.5.23's /server_info: every argument with only the watermark secrets
        # redacted, so whoever holds the API key reads it back in clear, in api_key and in
        # launch_command (the product keeps an allow-list of fields from this answer).
        e = self.engine
        info = logconfig.server_args_for_logging(e.args)
        info["launch_command"] = e.launch_command
        info["max_running_requests"] = e.b.max_running_requests
        info["mem_fraction_static"] = e.b.mem_fraction_static
        info["cuda_graph_max_bs_decode"] = e.b.cuda_graph_max_bs_decode
        state = {
            "last_gen_throughput": round(e.last_gen_throughput, 3),
            "memory_usage": {"weight": e.b.weights_per_gpu_gib, "kvcache": e.b.kv_cache_gib,
                             "token_capacity": e.b.token_capacity, "graph": e.b.graph_mem_gib},
            "effective_max_running_requests_per_dp": e.b.max_running_requests,
            "load": e.running,
        }
        if e.avg_accept_length is not None:
            state["avg_spec_accept_length"] = e.avg_accept_length
        info["internal_states"] = [state]
        info["version"] = SGLANG_VERSION
        self.send_json(200, info)

    def h_models(self):
        e = self.engine
        self.send_json(200, {"object": "list", "data": [{
            "id": e.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "sglang", "root": e.args.model_path, "parent": None,
            "max_model_len": e.args.context_length or physics.MODEL["context_length"],
        }]})

    def h_metrics(self):
        e = self.engine
        if not e.args.enable_metrics:
            return self.send_json(404, {"detail": "Not Found"})
        labels = f'model_name="{e.model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
        rows = [
            ("num_running_reqs", "gauge", "The number of running requests.", e.running),
            ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", e.queued),
            ("gen_throughput", "gauge", "The generation throughput (token/s).", e.last_gen_throughput),
            ("spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
             e.avg_accept_length or 0.0),
            ("spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding.",
             (e.b.accept_rate or 0.0) if e.avg_accept_length is not None else 0.0),
            ("token_usage", "gauge", "The token usage.", 0.0),
            ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", e.prompt_tokens_total),
            ("generation_tokens_total", "counter", "Number of generation tokens processed.",
             e.generation_tokens_total),
            ("num_requests_total", "counter", "Number of requests processed.", e.requests_total),
        ]
        out = []
        for name, kind, help_text, value in rows:
            out.append(f"# HELP sglang:{name} {help_text}")
            out.append(f"# TYPE sglang:{name} {kind}")
            out.append(f"sglang:{name}{{{labels}}} {float(value)}")
        self.send_text(200, "\n".join(out) + "\n", "text/plain; version=0.0.4; charset=utf-8")

    # ---- generation core ------------------------------------------------------------------------
    def gate(self, openai: bool) -> None:
        """Fault / physics checks common to every generate-style request."""
        e = self.engine
        kind = e.fault.kind
        if kind == "http_500":
            body = ({"object": "error", "message": "Internal server error", "type": "InternalServerError",
                     "param": None, "code": 500} if openai else {"error": {"message": "Internal server error"}})
            raise Abort(500, body)
        if kind == "never_healthy" or e.expired():
            raise Abort(503, {"error": {"message": "The server is not healthy (scheduler not responding)."}})
        with e.cond:
            first = not e.first_client_request_seen
            e.first_client_request_seen = True
        if first and kind == "crash_on_first_request":
            self.crash(("Fatal Python error: Segmentation fault", "",
                        "Current thread 0x00007f3a2d1fe640 (most recent call first):",
                        '  File "/opt/sglang/sglang/srt/model_executor/model_runner.py", line 2210 in forward_decode',
                        '  File "/opt/sglang/sglang/srt/managers/scheduler.py", line 1298 in event_loop_overlap'))
        if e.b.first_request_crash:
            # Only reachable with --skip-server-warmup: otherwise the warm-up died of it.
            time.sleep(min(0.2, e.ttft(8)))
            for note in e.b.notes:
                log(f"[lab] {note}")
            self.crash(generation_crash_lines(e.b))

    def crash(self, lines) -> None:
        log("\n".join(lines), tp=True)
        log("Received sigquit from a child process. It usually means the child failed.")
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        die(1)

    def steps_paced(self, comp: textgen.Completion, prompt_tokens: int):
        """Yield (start, end) token ranges, one per scheduler step, with real-time pacing;
        handles admission and the hang fault.

        The prefill step comes after the TTFT; every later step takes step_tokens() / rate
        seconds (a verify step of a speculative algorithm adds about accept_length tokens, so
        tokens/s stay the physics' rate).
        """
        e = self.engine
        e.admit()
        factor = e.request_factor()
        try:
            time.sleep(e.ttft(prompt_tokens))
            sizes = e.step_sizes(len(comp.tokens))
            # Steps are due on a schedule (not after relative sleeps), so per-step overhead
            # does not slow the stream below its configured rate.
            due = time.monotonic()
            start = 0
            for n, size in enumerate(sizes):
                end = start + size
                if n:
                    due += e.step_tokens() / (e.stream_rate() * factor)
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if e.fault.kind == "hang_midstream" and end > HANG_AFTER_TOKENS:
                    if start < HANG_AFTER_TOKENS:
                        yield start, HANG_AFTER_TOKENS
                    e.stuck = True
                    threading.Event().wait()  # stall forever, connection stays open
                yield start, end
                start = end
            if e.fault.kind == "hang_midstream":
                e.stuck = True
                threading.Event().wait()
            e.record(prompt_tokens, len(comp.tokens), e.stream_rate() * factor)
            e.decode_log(prompt_tokens + len(comp.tokens))
        finally:
            e.release()

    def run(self, prompt_key: str, prompt_tokens: int, max_new: Optional[int], chat: bool,
            stop, ignore_eos: bool):
        e = self.engine
        if isinstance(stop, str):
            stop = [stop]
        diverge, after = e.divergence()
        comp = textgen.complete(prompt_key, max_new, mode=e.mode, chat=chat, stop=stop or (),
                                ignore_eos=ignore_eos, diverge=diverge, diverge_after=after)
        return comp

    @staticmethod
    def sglang_finish(comp: textgen.Completion) -> dict:
        if comp.finish_type == "length":
            return {"type": "length", "length": len(comp.tokens)}
        return {"type": "stop", "matched": comp.matched}

    # ---- /generate --------------------------------------------------------------------------------
    def h_generate(self):
        body = self.read_json()
        if not isinstance(body, dict):
            raise Abort(400, {"error": {"message": "Request body must be a JSON object"}})
        text, ids = body.get("text"), body.get("input_ids")
        if text is None and ids is None:
            raise Abort(400, {"error": {"message": "Either text or input_ids should be provided."}})
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[0] if sp else {}
        stream = bool(body.get("stream"))
        batch = (isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)))
        if batch and stream:
            raise Abort(400, {"error": {"message": "Streaming is not supported for batched requests in the lab stand-in."}})
        self.gate(openai=False)
        items = (text if text is not None else ids) if batch else [text if text is not None else ids]
        rid = body.get("rid")
        results = []
        for n, item in enumerate(items):
            if isinstance(item, str):
                key, ptoks = item, len(textgen.tokenize(item))
            else:
                key, ptoks = " ".join(str(i) for i in item), len(item)
            max_new = sp.get("max_new_tokens", GENERATE_DEFAULT_MAX_NEW_TOKENS)
            comp = self.run(key, ptoks, max_new, False, sp.get("stop"), bool(sp.get("ignore_eos")))
            req_id = (rid[n] if isinstance(rid, list) else rid) or uuid.uuid4().hex
            cached = self.engine.cached_tokens(key, ptoks)
            started = time.monotonic()
            logprobs = bool(body.get("return_logprob"))
            top_k = int(body.get("top_logprobs_num") or 0)
            token_lps = comp.token_logprobs(key) if logprobs else []
            top_lps = comp.top_logprobs(top_k, key) if logprobs and top_k > 0 else []

            def meta(done: bool, count: int) -> dict:
                m = {"id": req_id,
                     "finish_reason": self.sglang_finish(comp) if done else None,
                     "prompt_tokens": ptoks, "weight_version": "default", "num_retractions": 0,
                     "reasoning_tokens": 0, "completion_tokens": count, "cached_tokens": cached}
                if done:
                    m["e2e_latency"] = round(time.monotonic() - started, 6)
                    m.update(self.engine.spec_meta(count))   # the finished chunk only
                if logprobs:
                    # cumulative across stream events, like text (SGLang's add_logprob_to_meta_info)
                    m["output_token_logprobs"] = token_lps[:count]
                    m["output_token_logprobs_length"] = count
                    m["input_token_logprobs"] = []
                    if top_k > 0:
                        m["output_top_logprobs"] = top_lps[:count]
                return m

            if stream:
                self.start_stream()
                # One event per scheduler step, cumulative text and output_ids
                # (incremental_streaming_output=False): a step may add several tokens.
                for _start, end in self.steps_paced(comp, ptoks):
                    done = end == len(comp.tokens)
                    self.sse({"text": "".join(comp.tokens[:end]), "output_ids": comp.ids[:end],
                              "meta_info": meta(done, end)})
                if not comp.tokens:
                    self.sse({"text": "", "output_ids": [], "meta_info": meta(True, 0)})
                self.sse("[DONE]")
                self.end_stream()
                return
            for _ in self.steps_paced(comp, ptoks):
                pass
            results.append({"text": "".join(comp.tokens), "output_ids": comp.ids,
                            "meta_info": meta(True, len(comp.tokens))})
        self.send_json(200, results if batch else results[0])

    # ---- OpenAI ----------------------------------------------------------------------------------
    @staticmethod
    def openai_finish(comp: textgen.Completion) -> str:
        return "length" if comp.finish_type == "length" else "stop"

    @staticmethod
    def usage(ptoks: int, ctoks: int) -> dict:
        return {"prompt_tokens": ptoks, "completion_tokens": ctoks, "total_tokens": ptoks + ctoks,
                "prompt_tokens_details": None}

    def openai_common(self, body: dict, chat: bool):
        if not isinstance(body, dict):
            raise Abort(400, {"object": "error", "message": "Request body must be a JSON object",
                              "type": "BadRequestError", "param": None, "code": 400})
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise Abort(400, {"object": "error", "message": "messages must be a non-empty list",
                                  "type": "BadRequestError", "param": "messages", "code": 400})
            rendered = ""
            for m in msgs:
                content = m.get("content") if isinstance(m, dict) else ""
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                rendered += f"<|im_start|>{(m or {}).get('role', 'user')}\n{content or ''}<|im_end|>\n"
            key = rendered + "<|im_start|>assistant\n"
            max_new = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                prompt = prompt[0] if prompt else ""
                if isinstance(prompt, int):
                    prompt = " ".join(str(i) for i in body["prompt"])
                elif isinstance(prompt, list):
                    prompt = " ".join(str(i) for i in prompt)
            if not isinstance(prompt, str):
                raise Abort(400, {"object": "error", "message": "prompt is required",
                                  "type": "BadRequestError", "param": "prompt", "code": 400})
            key = prompt
            max_new = body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
        ptoks = len(textgen.tokenize(key))
        self.gate(openai=True)
        comp = self.run(key, ptoks, max_new, chat, body.get("stop"), bool(body.get("ignore_eos")))
        return key, ptoks, comp

    def h_completions(self):
        self._openai(chat=False)

    def h_chat(self):
        self._openai(chat=True)

    def _openai(self, chat: bool):
        body = self.read_json()
        key, ptoks, comp = self.openai_common(body, chat)
        e = self.engine
        e.cached_tokens(key, ptoks)
        started = time.monotonic()
        rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex  # the request id
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        matched = comp.matched if comp.finish_type == "stop" else None
        if body.get("stream"):
            chunk_obj = "chat.completion.chunk" if chat else "text_completion"
            stream_options = body.get("stream_options") or {}
            include_usage = bool(stream_options.get("include_usage"))
            continuous_usage = bool(stream_options.get("continuous_usage_stats"))

            def choice(delta_text: Optional[str], finish: Optional[str], first: bool = False) -> dict:
                if chat:
                    delta = {}
                    if first:
                        delta["role"] = "assistant"
                    if delta_text is not None:
                        delta["content"] = delta_text
                    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                            "matched_stop": matched if finish else None}
                return {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish,
                        "matched_stop": matched if finish else None}

            def chunk(ch: Optional[dict], usage=None) -> dict:
                return {"id": rid, "object": chunk_obj, "created": created, "model": e.model_name,
                        "choices": [ch] if ch else [], "usage": usage}

            self.start_stream()
            # One chunk per scheduler step with the step's new text (serving_completions /
            # serving_chat): completions put finish_reason on the last step's chunk; chat sends
            # the role chunk with the first step, skips empty deltas and ends with a finish chunk.
            finish = self.openai_finish(comp)
            steps = 0
            for start, end in self.steps_paced(comp, ptoks):
                steps += 1
                delta_text = "".join(comp.tokens[start:end])
                done = end == len(comp.tokens)
                if chat:
                    if steps == 1:
                        self.sse(chunk(choice("", None, first=True)))
                    if delta_text:
                        self.sse(chunk(choice(delta_text, None),
                                       self.usage(ptoks, end) if continuous_usage else None))
                else:
                    self.sse(chunk(choice(delta_text, finish if done else None),
                                   self.usage(ptoks, end) if continuous_usage else None))
            if not comp.tokens:
                if chat:
                    self.sse(chunk(choice("", None, first=True)))
                else:
                    self.sse(chunk(choice("", finish), self.usage(ptoks, 0) if continuous_usage else None))
            if chat:
                self.sse(chunk(choice(None, finish)))
            if include_usage:
                self.sse(chunk(None, self.usage(ptoks, len(comp.tokens))))
            self.sse("[DONE]")
            self.end_stream()
            return
        for _ in self.steps_paced(comp, ptoks):
            pass
        text = "".join(comp.tokens)
        if chat:
            ch = {"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                          "tool_calls": None},
                  "logprobs": None, "finish_reason": self.openai_finish(comp), "matched_stop": matched}
        else:
            ch = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.openai_finish(comp),
                  "matched_stop": matched}
        self.send_json(200, {"id": rid, "object": obj, "created": created, "model": e.model_name,
                             "choices": [ch], "usage": self.usage(ptoks, len(comp.tokens))})


class LabHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Uvicorn listens with a backlog of 2048; the stdlib default of 5 drops SYNs under bursts.
    request_queue_size = 2048

    def server_bind(self):
        # HTTPServer.server_bind() calls socket.getfqdn(), a DNS lookup uvicorn never makes.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), port

    def get_request(self):
        conn, addr = super().get_request()
        # Like uvicorn: no Nagle delay on streamed tokens.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr


def make_server(engine: LabEngine, host: str, port: int) -> LabHTTPServer:
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    server_cls = LabHTTPServer
    if ":" in host:
        server_cls = type("LabHTTPServer6", (LabHTTPServer,), {"address_family": socket.AF_INET6})
    return server_cls((host, port), handler)


# -------------------------------------------------------------------------------------------------
# start-up
# -------------------------------------------------------------------------------------------------

def _on_term(signum, frame):  # noqa: ARG001
    raw("INFO:     Shutting down")
    raw("INFO:     Finished server process [%d]" % os.getpid())
    die(0)


def warmup(engine: LabEngine, config: LabConfig, port: int) -> None:
    """http_server._wait_and_warmup: the server POSTs /generate (8 tokens, temperature 0) to
    itself and reports ready only when it returns 200.  A server that dies on its first
    generation therefore dies here and never becomes healthy."""
    comp = textgen.complete(textgen.WARMUP_PROMPT, 8, mode=engine.mode)
    if engine.args.skip_server_warmup and config.fault.kind != "never_healthy":
        engine.mark_ready()
        log("The server is fired up and ready to roll!")
        return
    time.sleep(config.warmup_seconds)
    if config.fault.kind == "never_healthy":
        return  # the warm-up request never comes back
    if engine.b.first_request_crash:
        for note in engine.b.notes:
            log(f"[lab] {note}")
        log("\n".join(generation_crash_lines(engine.b)), tp=True)
        log("Received sigquit from a child process. It usually means the child failed.")
        die(1)
    engine.record(len(textgen.tokenize(textgen.WARMUP_PROMPT)), len(comp.tokens), engine.rate)
    raw(f'[{_ts()}] INFO:     127.0.0.1:{port} - "POST /generate HTTP/1.1" 200 OK')
    if config.debug:
        log(f"[lab] warm-up output: {''.join(comp.tokens)!r}")
    engine.mark_ready()
    log("The server is fired up and ready to roll!")


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config()
    except ValueError as exc:
        print(f"sglang_lab_standin: {exc}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)

    source = physics.inspect_source(physics.find_sglang_dir())
    extra = cli.source_flags(source)
    args = cli.parse_args(argv, extra_flags=extra)   # SystemExit(2) like the real parser
    if args.model_path is None:
        cli.build_parser(extra).error("the following arguments are required: --model-path")

    # Like the engine: sglang's logging set-up (a missing SGLANG_LOGGING_CONFIG_PATH file raises
    # here, exit 1 with the traceback), then server_args={...} at INFO, API key in clear.
    logconfig.configure_logger(args.log_level)
    logconfig.log_server_args(args)
    config = dataclasses.replace(config, fault=config.fault_for(args.speculative_algorithm))
    if config.fault.kind == "exit_on_start":
        time.sleep(0.1 * config.startup_seconds)
        log("Traceback (most recent call last):\n"
            '  File "/usr/lib/python3.11/runpy.py", line 198, in _run_module_as_main\n'
            "RuntimeError: [lab fault exit_on_start] the server process exited during start-up")
        die(1)
    gpus = physics.query_gpus()
    b = physics.decide(gpus, args, source)
    if config.debug:
        log(f"[lab] physics: {b}")
    for warning in b.warnings:  # server-args resolution, as the real speculative_hook logs them
        logging.getLogger(SPECULATIVE_HOOK_LOGGER).warning(warning)
    s = config.startup_seconds

    def crash_now():
        for note in b.notes:
            log(f"[lab] {note}")
        log("\n".join(b.crash_lines), tp=b.crash_phase != "args")
        if b.crash_phase != "args":
            log("Received sigquit from a child process. It usually means the child failed.")
        die(b.exit_code)

    time.sleep(0.1 * s)
    if b.crash_phase in ("args", "spawn"):
        crash_now()
    tp_note = f"Init torch distributed begin. tp_size={b.tp_size}"
    log(tp_note, tp=True)
    total = b.gpu_memory_gib
    log(f"Load weight begin. avail mem={_gib(total - 0.6)} GB", tp=True)
    time.sleep((0.5 if b.cuda_graph_decode else 0.7) * s)
    if b.crash_phase == "load_weights":
        crash_now()
    avail = total - 0.6 - b.weights_per_gpu_gib
    log(f"Load weight end. elapsed={0.5 * s:.2f} s, type={physics.MODEL['architecture']}, "
        f"dtype=torch.bfloat16, avail mem={_gib(avail)} GB, mem usage={_gib(b.weights_per_gpu_gib)} GB.", tp=True)
    time.sleep(0.1 * s)
    if b.crash_phase == "memory_pool":
        crash_now()
    half = b.kv_cache_gib / 2
    log(f"KV Cache is allocated. #tokens: {b.token_capacity}, K size: {_gib(half)} GB, V size: {_gib(half)} GB",
        tp=True)
    avail -= b.kv_cache_gib
    log(f"Memory pool end. avail mem={_gib(avail)} GB", tp=True)
    if b.cuda_graph_decode:
        log(f"Capture cuda graph begin. This can take up to several minutes. avail mem={_gib(avail)} GB", tp=True)
        time.sleep(0.3 * s)
        if b.crash_phase == "cuda_graph":
            crash_now()
        log(f"Capture cuda graph end. Time elapsed: {0.3 * s:.2f} s. mem usage={_gib(b.graph_mem_gib)} GB. "
            f"avail mem={_gib(avail - b.graph_mem_gib)} GB.", tp=True)
    if b.crash_phase == "spec_worker":  # the draft worker is built once the target is up
        crash_now()
    if not b.serves:  # pragma: no cover - every crash phase is handled above
        crash_now()
    log(f"max_total_num_tokens={b.token_capacity}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        f"max_running_requests={b.max_running_requests}, context_len={args.context_length or physics.MODEL['context_length']}, "
        f"available_gpu_mem={_gib(avail - b.graph_mem_gib)} GB", tp=True)

    engine = LabEngine(args, b, config, logconfig.launch_command(argv, getattr(args, "watermark_config", None)))
    try:
        server = make_server(engine, args.host, args.port)
    except OSError as exc:
        log(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
            f"('{args.host}', {args.port}): {exc.strerror}")
        die(1)
    port = server.server_address[1]
    raw(f"INFO:     Started server process [{os.getpid()}]")
    raw("INFO:     Waiting for application startup.")
    raw("INFO:     Application startup complete.")
    raw(f"INFO:     Uvicorn running on http://{args.host}:{port} (Press CTRL+C to quit)")
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    threading.Thread(target=warmup, args=(engine, config, port), name="warmup", daemon=True).start()
    stop = threading.Event()
    while not stop.wait(0.5):
        pass
    return 0  # pragma: no cover
