# -*- coding: utf-8 -*-
"""Serving benchmark for SGLang's streaming ``/generate`` (stdlib only).

Three parts:

* the workload: a fixed, versioned list of prompts with fixed output lengths
  (``load_workload``, ``workload_hash``);
* the load client: asyncio with raw streams speaking HTTP/1.1, one connection
  per request (as ``sglang.bench_serving`` does with one aiohttp session per
  request), greedy sampling, ``ignore_eos`` so every request produces exactly
  ``max_new_tokens`` tokens, a closed loop of ``concurrency`` workers, a
  warm-up that is not measured (``run_benchmark``);
* the metrics: pure functions of per-request records (``request_metrics``,
  ``level_metrics``) with the names and meanings of bench_serving's JSON
  output (``completed``, ``output_throughput``, ``median_ttft_ms``,
  ``p99_itl_ms``, ...).  docs/benchmark.md lists every definition.

A per-request record is a plain dict (JSON-serialisable)::

    {"start": 10.0,                 # perf_counter() when the request was sent
     "chunks": [[10.2, 1], [10.3, 2], [10.5, 5]],
                                    # (arrival time, cumulative completion_tokens)
                                    # of every streamed chunk that added tokens
     "end": 10.51,                  # arrival of the last line ([DONE])
     "prompt_tokens": 12,           # meta_info.prompt_tokens (server side)
     "output_tokens": 5,            # last meta_info.completion_tokens
     "accept_length": 3.1,          # last meta_info.spec_accept_length or None
     "error": None}                 # a string when the request failed

The client is lean on purpose (the machine running it may have few cores):
it does not ``json.loads`` every cumulative chunk.  All SSE events that came
in one socket read share one arrival time, so they form one chunk; only the
last event of a read is searched (a byte regex) for ``completion_tokens``.
The final event is parsed in full once, for ``meta_info``.  This matches
bench_serving's treatment of a chunk that carries several tokens: its gap is
divided evenly over its tokens.

The HTTP/1.1 messages are http/client's; this module keeps only the asyncio transport.
Imported by the sglang_bench module (AnsiballZ ships it) and by the ddtree-bench CLI on the
controller (plugins/plugin_utils/cli/bench.py): it must not import ansible itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import re
import socket
import ssl
import time

from ansible_collections.ddtree.fleet.plugins.module_utils.http.client import (BadURL, BodyDecoder, HttpError, get_json, parse_head,
                                                                       request_bytes)
from ansible_collections.ddtree.fleet.plugins.module_utils.http.client import parse_base_url as _parse_base_url

SCHEMA_VERSION = 1
DEFAULT_CONCURRENCY = (1, 4, 16, 48)
DEFAULT_REQUEST_TIMEOUT = 1800.0   # seconds, whole request (bench_serving allows 6 h)
MAX_ERROR_MESSAGES = 5
USER_AGENT = "ddtree-bench/1"

_COMPLETION_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class BenchError(Exception):
    """The benchmark cannot run at all (bad URL, bad workload, ...)."""


# ---------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------

def canonical_json(obj) -> bytes:
    """Canonical JSON bytes: sorted keys, no insignificant whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def workload_hash(workload) -> str:
    """sha256 (hex) of the canonical JSON of the whole workload object."""
    return hashlib.sha256(canonical_json(workload)).hexdigest()


def validate_workload(workload) -> dict:
    if not isinstance(workload, dict):
        raise BenchError("workload must be a JSON object")
    version = workload.get("version")
    if not isinstance(version, str) or not version:
        raise BenchError("workload needs a non-empty string 'version'")
    reqs = workload.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise BenchError("workload needs a non-empty list 'requests'")
    ids = set()
    for n, r in enumerate(reqs):
        if not isinstance(r, dict):
            raise BenchError(f"workload request {n} is not an object")
        if not isinstance(r.get("prompt"), str) or not r["prompt"]:
            raise BenchError(f"workload request {n} needs a non-empty string 'prompt'")
        mnt = r.get("max_new_tokens")
        if not isinstance(mnt, int) or isinstance(mnt, bool) or mnt < 1:
            raise BenchError(f"workload request {n} needs an integer 'max_new_tokens' >= 1")
        rid = r.get("id", str(n))
        if rid in ids:
            raise BenchError(f"workload request id {rid!r} is not unique")
        ids.add(rid)
    return workload


def load_workload(path: str) -> dict:
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read workload {path}: {exc}") from None
    return validate_workload(data)


# ---------------------------------------------------------------------------------------------
# Statistics (numpy-free; same results as numpy's defaults)
# ---------------------------------------------------------------------------------------------

def percentile(values, p: float) -> float:
    """numpy.percentile(values, p) with the default 'linear' method.

    Sort the n values; the rank is r = p/100 * (n - 1); the result interpolates
    linearly between the values at floor(r) and ceil(r).  p=50 is the median
    (the mean of the two middle values when n is even).  Empty input gives 0.0,
    like bench_serving's ``np.percentile(xs or 0, p)``.
    """
    if not values:
        return 0.0
    xs = sorted(values)
    if not 0 <= p <= 100:
        raise ValueError("percentile must be within [0, 100]")
    rank = (len(xs) - 1) * (p / 100.0)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    frac = rank - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def mean(values) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def std(values) -> float:
    """Population standard deviation (numpy's default ddof=0)."""
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def _summary(prefix: str, values_s, out: dict) -> None:
    """mean/median/std/p90/p95/p99 of seconds, written as <stat>_<prefix>_ms."""
    ms = [v * 1000.0 for v in values_s]
    out[f"mean_{prefix}_ms"] = mean(ms)
    out[f"median_{prefix}_ms"] = percentile(ms, 50)
    out[f"std_{prefix}_ms"] = std(ms)
    for p in (90, 95, 99):
        out[f"p{p}_{prefix}_ms"] = percentile(ms, p)


# ---------------------------------------------------------------------------------------------
# Metrics (pure)
# ---------------------------------------------------------------------------------------------

def request_metrics(rec: dict) -> dict:
    """ttft, e2e latency, tpot and the ITL list (all seconds) of one successful request.

    * ttft = arrival of the first chunk that carried tokens - start.
    * latency = arrival of the last line of the stream - start.
    * output_len = the last cumulative completion_tokens.
    * tpot = (latency - ttft) / (output_len - 1), only when output_len > 1.
    * itl: for every later chunk that adds k > 0 tokens, the gap since the previous
      such chunk divided by k, repeated k times (so a chunk of k tokens contributes
      k equal entries).  Chunks that add no tokens are skipped and do not reset the
      clock.  Tokens of the first chunk have no ITL entry.
    """
    start = rec["start"]
    chunks = rec.get("chunks") or []
    output_len = int(rec.get("output_tokens") or (chunks[-1][1] if chunks else 0))
    ttft = (chunks[0][0] - start) if chunks else 0.0
    latency = rec["end"] - start
    itl = []
    if chunks:
        prev_t, prev_n = chunks[0][0], chunks[0][1]
        for t, n in chunks[1:]:
            k = n - prev_n
            if k <= 0:
                continue
            gap = (t - prev_t) / k
            itl.extend([gap] * k)
            prev_t, prev_n = t, n
    tpot = (latency - ttft) / (output_len - 1) if output_len > 1 else None
    return {"ttft": ttft, "latency": latency, "tpot": tpot, "itl": itl, "output_len": output_len}


def level_metrics(records, duration_s: float, accept_length=None, concurrency=None) -> dict:
    """bench_serving-style metrics of one concurrency level.

    ``records``: per-request dicts (see the module docstring).  ``duration_s``: the
    wall time of the level, first request sent to last request finished.
    ``accept_length``: /server_info internal_states[0].avg_spec_accept_length when
    known; otherwise the mean of the per-request meta_info.spec_accept_length.
    Failed requests count in ``errors`` and in no other number.
    """
    if duration_s <= 0:
        raise ValueError("duration_s must be > 0")
    errors = [str(rec["error"]) for rec in records if rec.get("error")]
    ok = [(rec, request_metrics(rec)) for rec in records if not rec.get("error")]
    total_in = sum(int(rec.get("prompt_tokens") or 0) for rec, _ in ok)
    total_out = sum(m["output_len"] for _, m in ok)
    itls = [gap for _, m in ok for gap in m["itl"]]
    e2es = [m["latency"] for _, m in ok]
    per_req_accept = [float(rec["accept_length"]) for rec, _ in ok
                      if rec.get("accept_length") is not None]
    out = {
        "concurrency": concurrency,
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(errors),
        "duration": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "input_throughput": total_in / duration_s,
        "output_throughput": total_out / duration_s,
        "total_throughput": (total_in + total_out) / duration_s,
    }
    out["total_token_throughput"] = out["total_throughput"]   # the name bench_serving prints
    _summary("ttft", [m["ttft"] for _, m in ok], out)
    _summary("tpot", [m["tpot"] for _, m in ok if m["tpot"] is not None], out)
    _summary("itl", itls, out)
    out["max_itl_ms"] = max(itls) * 1000.0 if itls else 0.0
    _summary("e2e_latency", e2es, out)
    # bench_serving's "concurrency": the mean number of requests in flight.
    out["mean_concurrency"] = math.fsum(e2es) / duration_s
    out["max_output_tokens_per_s"], out["max_concurrent_requests"] = peak_per_second(ok)
    if accept_length is not None:
        out["accept_length"] = float(accept_length)
        out["accept_length_source"] = "server_info"
    elif per_req_accept:
        out["accept_length"] = mean(per_req_accept)
        out["accept_length_source"] = "meta_info"
    else:
        out["accept_length"] = None
        out["accept_length_source"] = None
    out["errors"] = len(errors)
    out["error_messages"] = errors[:MAX_ERROR_MESSAGES]
    return out


def peak_per_second(ok) -> tuple:
    """Peak output tokens in a one-second bucket and peak requests in flight per bucket.

    As bench_serving: buckets are whole seconds from the earliest start; every token is
    placed at its chunk's arrival time (the first chunk's tokens at ttft count as one
    token there, then one per ITL entry); a request counts in every bucket from its
    start bucket to its end bucket.
    """
    if not ok:
        return 0.0, 0
    t0 = min(rec["start"] for rec, _ in ok)
    t_end = max(rec["start"] + m["latency"] for rec, m in ok)
    nb = int(math.ceil(t_end - t0)) + 1
    tok = [0] * nb
    req = [0] * nb
    for rec, m in ok:
        for t in itertools.accumulate(m["itl"], initial=rec["start"] + m["ttft"]):
            b = int(t - t0)
            if 0 <= b < nb:
                tok[b] += 1
        first = int(rec["start"] - t0)
        last = int(rec["start"] + m["latency"] - t0)
        for b in range(first, min(last + 1, nb)):
            req[b] += 1
    return float(max(tok)), int(max(req))


# ---------------------------------------------------------------------------------------------
# HTTP/1.1 over asyncio streams
# ---------------------------------------------------------------------------------------------

def parse_base_url(url: str) -> dict:
    """http.client.parse_base_url; a bad URL is a BenchError (the benchmark cannot run)."""
    try:
        return _parse_base_url(url)
    except BadURL as exc:
        raise BenchError(str(exc)) from None


async def _open(target: dict, timeout: float):
    ctx = ssl.create_default_context() if target["scheme"] == "https" else None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(target["host"], target["port"], ssl=ctx, limit=1 << 22),
        timeout)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    return reader, writer


_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)   # Linux only


def _quickack(sock) -> None:
    """Ask the kernel to ACK at once instead of delaying the ACK (up to 40 ms).

    A server that writes the response head and then each SSE event as separate small
    segments without TCP_NODELAY (Nagle on) cannot send the next segment before the
    previous one is acknowledged; with the client's delayed ACK every such stall
    costs up to 40 ms and lands in TTFT/ITL.  SGLang itself (uvicorn on asyncio) sets
    TCP_NODELAY, so there it changes nothing.  Linux clears the flag after use, so it is
    set again after every read.
    """
    if _TCP_QUICKACK is not None and sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        except OSError:
            pass


async def _read_body(reader, headers: dict, status: int, limit: int) -> bytes:
    """The first ``limit`` bytes of a small (error) response's body, as far as the peer sent it."""
    dec = BodyDecoder(headers, status)
    out = bytearray()
    while not dec.done and len(out) < limit:
        data = await reader.read(65536)
        if not data:
            break
        out += dec.feed(data)
    return bytes(out[:limit])


def generate_payload(prompt: str, max_new_tokens: int) -> dict:
    """The /generate body: greedy, exactly max_new_tokens tokens, streamed."""
    return {"text": prompt,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": int(max_new_tokens),
                                "ignore_eos": True},
            "stream": True}


def _error_text(exc: BaseException) -> str:
    name = type(exc).__name__
    msg = str(exc)
    return f"{name}: {msg}" if msg else name


class ConnectionPool:
    """Idle keep-alive connections to one server (HTTP/1.1 persistent connections).

    A closed-loop worker takes a connection, runs one request on it and gives it back,
    so a level with c workers opens about c connections in its warm-up and none while it
    is measured.  At most 4 connections are opened at a time so that a burst of c workers
    never overflows a small listen backlog (a SYN dropped there costs a 1 s retransmit).
    """

    def __init__(self, target: dict):
        self.target = target
        self.idle = []
        self.gate = asyncio.Semaphore(4)

    async def get(self, timeout: float) -> tuple:
        """(reader, writer, reused)."""
        while self.idle:
            reader, writer = self.idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer, True
            writer.close()
        async with self.gate:
            reader, writer = await _open(self.target, timeout)
        return reader, writer, False

    def put(self, reader, writer) -> None:
        self.idle.append((reader, writer))

    def close(self) -> None:
        while self.idle:
            self.idle.pop()[1].close()


async def stream_generate(target: dict, body: bytes, api_key=None,
                          timeout: float = DEFAULT_REQUEST_TIMEOUT, parse: str = "last",
                          pool=None, quickack: bool = False) -> dict:
    """Send one streaming /generate and time it.  Returns a record (module docstring).

    With a ``pool`` the connection is kept alive and reused; a reused connection that
    fails before any response byte (the server closed it while idle) is retried once on
    a new connection, with a new start time.
    """
    clock = time.perf_counter
    for attempt in (0, 1):
        rec = {"start": 0.0, "chunks": [], "end": 0.0, "prompt_tokens": 0,
               "output_tokens": 0, "accept_length": None, "error": None}
        conn = {"writer": None, "head": False, "reused": False, "reusable": False}

        async def run():
            rec["start"] = clock()
            if pool is not None:
                reader, writer, conn["reused"] = await pool.get(timeout)
            else:
                reader, writer = await _open(target, timeout)
            conn["writer"] = writer
            sock = writer.get_extra_info("socket") if quickack else None
            _quickack(sock)
            writer.write(request_bytes(target, "POST", "/generate", body, api_key=api_key,
                                       keep_alive=pool is not None, user_agent=USER_AGENT))
            await writer.drain()
            status, headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
            conn["head"] = True
            if status != 200:
                data = await _read_body(reader, headers, status, limit=4096)
                rec["end"] = clock()
                rec["error"] = (f"HTTP {status}: "
                                + data.decode("utf-8", "replace").strip()[:300])
                return
            _quickack(sock)
            clean = await _consume_stream(reader, headers, rec, clock, parse, sock)
            if (pool is not None and clean and not rec["error"]
                    and headers.get("connection", "").lower() != "close"):
                conn["reusable"] = True
                pool.put(reader, writer)

        try:
            await asyncio.wait_for(run(), timeout)
        except asyncio.TimeoutError:
            rec["error"] = f"timeout after {timeout:g} s ({rec['output_tokens']} tokens received)"
        except (OSError, EOFError, ConnectionError, asyncio.IncompleteReadError, ValueError,
                asyncio.LimitOverrunError) as exc:
            rec["error"] = _error_text(exc) + f" ({rec['output_tokens']} tokens received)"
        finally:
            if conn["writer"] is not None and not conn["reusable"]:
                conn["writer"].close()
        if not rec["end"]:
            rec["end"] = clock()
        if rec["error"] and conn["reused"] and not conn["head"] and attempt == 0:
            continue
        return rec
    return rec  # pragma: no cover - the loop always returns


def _event_payloads(complete: bytes, every: bool) -> list:
    """Data payloads of the complete SSE events in ``complete``, last first.

    every=False: only the last event (and the one before it when the last is [DONE]).
    """
    events = complete.split(b"\n\n") if every else complete.rsplit(b"\n\n", 2)
    out = []
    for ev in reversed(events):
        ev = ev.strip()
        if ev.startswith(b"data:"):
            ev = ev[5:].strip()
        if ev:
            out.append(ev)
    return out


async def _consume_stream(reader, headers: dict, rec: dict, clock, parse: str = "last",
                          sock=None) -> bool:
    """Read the SSE stream; one chunk per socket read that added tokens.

    parse="last" (default): the last event of each read is searched for
    completion_tokens with a byte regex, nothing else is decoded.  parse="every":
    every event is json-decoded, as bench_serving does (same numbers, more CPU;
    kept to measure the difference, see tests/bench/client_capacity.py).
    Returns True when the response ended cleanly (the connection can be reused).
    """
    every = parse == "every"
    dec = BodyDecoder(headers)
    chunks = rec["chunks"]
    pending = b""          # SSE bytes not yet ended by a blank line
    last_event = None      # last complete non-[DONE] data payload
    last_n = 0
    saw_done = False
    while True:
        data = await reader.read(262144)
        if not data:
            break
        now = clock()
        _quickack(sock)
        data = dec.feed(data)
        if data:
            pending += data
            cut = pending.rfind(b"\n\n")
            if cut >= 0:
                complete, pending = pending[:cut], pending[cut + 2:]
                n_new = None
                for ev in _event_payloads(complete, every):
                    if ev == b"[DONE]":
                        saw_done = True
                        continue
                    if every:
                        try:
                            obj = json.loads(ev)
                        except ValueError:
                            obj = None
                        if isinstance(obj, dict) and not obj.get("error"):
                            if n_new is None:
                                n_new = _tokens_in(obj)
                                last_event = ev
                            continue
                    else:
                        at = ev.rfind(b'"completion_tokens"')
                        m = _COMPLETION_RE.match(ev, at) if at >= 0 else None
                        if m is not None:
                            n_new = int(m.group(1))
                            last_event = ev
                            break
                        if b'"output_ids"' in ev and b'"error"' not in ev:
                            # no token count: decode this event for its cumulative output_ids
                            try:
                                obj = json.loads(ev)
                            except ValueError:
                                obj = None
                            if isinstance(obj, dict):
                                n_new = _tokens_in(obj)
                                last_event = ev
                                break
                    if b'"error"' in ev:
                        _record_final(ev, rec)
                        if rec["error"]:
                            rec["end"] = now
                            return False
                    if not every:
                        break
                if n_new is not None and n_new > last_n:
                    chunks.append((now, n_new))
                    last_n = n_new
                    rec["output_tokens"] = n_new
                rec["end"] = now
        if dec.done or (saw_done and dec.mode == "close"):
            break
    if last_event is not None:
        _record_final(last_event, rec)
    if rec["error"]:
        return False
    if not saw_done:
        rec["error"] = (f"stream ended without [DONE] ({rec['output_tokens']} tokens received)")
    elif not chunks:
        rec["error"] = "no tokens streamed"
    return dec.done and not pending.strip()


def _tokens_in(obj: dict) -> int:
    """Cumulative tokens of one /generate event: meta_info.completion_tokens, else the length
    of the cumulative output_ids.  Never one per event: an event is a scheduler step, and under
    speculative decoding a step adds several tokens."""
    ct = (obj.get("meta_info") or {}).get("completion_tokens")
    if ct is not None:
        return int(ct)
    ids = obj.get("output_ids")
    return len(ids) if isinstance(ids, list) else 0


def _record_final(ev: bytes, rec: dict) -> None:
    try:
        obj = json.loads(ev)
    except ValueError:
        rec["error"] = "unparsable stream event: " + ev[:200].decode("utf-8", "replace")
        return
    if not isinstance(obj, dict):
        return
    if obj.get("error"):
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        rec["error"] = f"server error in stream: {msg}"
        return
    meta = obj.get("meta_info") or {}
    if meta.get("prompt_tokens") is not None:
        rec["prompt_tokens"] = int(meta["prompt_tokens"])
    if meta.get("completion_tokens") is not None or isinstance(obj.get("output_ids"), list):
        rec["output_tokens"] = _tokens_in(obj)
    # spec_* are in the finished event only (SGLang's tokenizer manager); this is that event.
    if meta.get("spec_accept_length") is not None:
        rec["accept_length"] = float(meta["spec_accept_length"])
    fr = meta.get("finish_reason")
    if isinstance(fr, dict):
        rec["finish_reason"] = fr.get("type")
    elif fr is not None:
        rec["finish_reason"] = fr


# ---------------------------------------------------------------------------------------------
# Load generation
# ---------------------------------------------------------------------------------------------

def expand_workload(workload: dict, n: int, tag: str, max_new_tokens_override=None,
                    unique_prefix: bool = True) -> list:
    """n /generate bodies cycling through the workload's requests.

    With ``unique_prefix`` every prompt starts with ``[tag-i] `` so that no two requests
    share a prefix: the server's radix (prefix) cache cannot turn a repeated prompt into a
    near-free prefill, as with bench_serving's random dataset.
    """
    reqs = workload["requests"]
    out = []
    for i in range(n):
        r = reqs[i % len(reqs)]
        mnt = max_new_tokens_override or r["max_new_tokens"]
        prompt = f"[{tag}-{i}] {r['prompt']}" if unique_prefix else r["prompt"]
        out.append(canonical_json(generate_payload(prompt, mnt)))
    return out


async def run_batch(target: dict, bodies: list, concurrency: int, api_key=None,
                    timeout: float = DEFAULT_REQUEST_TIMEOUT, parse: str = "last",
                    pool=None, quickack: bool = False) -> tuple:
    """Run ``bodies`` with at most ``concurrency`` in flight (closed loop).

    Returns (records in request order, wall seconds from the first send to the last end).
    ``pool``: a ConnectionPool to keep connections alive (None = one connection per
    request, like bench_serving).
    """
    records = [None] * len(bodies)
    nxt = 0

    async def worker():
        nonlocal nxt
        while nxt < len(bodies):
            i = nxt
            nxt += 1
            records[i] = await stream_generate(target, bodies[i], api_key, timeout, parse, pool,
                                               quickack)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(bodies))))))
    return records, time.perf_counter() - t0


async def server_accept_length(base_url: str, api_key=None):
    try:
        status, info = await asyncio.to_thread(get_json, base_url, "/server_info", api_key, 10.0,
                                               user_agent=USER_AGENT)
    except HttpError:
        return None
    if status != 200 or not isinstance(info, dict):
        return None
    if isinstance(info.get("decode"), list) and info["decode"]:
        info = info["decode"][0]
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        v = states[0].get("avg_spec_accept_length")
        return float(v) if v is not None else None
    return None


async def run_benchmark(base_url: str, workload: dict, concurrency_levels=DEFAULT_CONCURRENCY,
                        requests_per_level=None, warmup=None, api_key=None,
                        timeout: float = DEFAULT_REQUEST_TIMEOUT, max_new_tokens=None,
                        pause_s: float = 1.0, unique_prefix: bool = True, keep_alive: bool = True,
                        quickack: bool = False, log=None) -> dict:
    """Every level in turn: warm-up (not measured), pause, N measured requests.

    requests_per_level None = 4 x concurrency (at least 8).  warmup None = concurrency
    requests (one per worker), 0 = none.  Stops after a level where every request failed.
    keep_alive: reuse connections within a level (warm-up opens them).
    Returns {"levels": [...], "status": "ok"|"failed", "evidence": {...}|None}.
    """
    target = parse_base_url(base_url)
    levels = []
    status, evidence = "ok", None
    for c in concurrency_levels:
        c = int(c)
        n = requests_per_level or max(8, 4 * c)
        w = c if warmup is None else int(warmup)
        pool = ConnectionPool(target) if keep_alive else None
        if w:
            wb = expand_workload(workload, w, f"warmup-c{c}", max_new_tokens, unique_prefix)
            await run_batch(target, wb, c, api_key, timeout, pool=pool, quickack=quickack)
            if pause_s:
                await asyncio.sleep(pause_s)
        bodies = expand_workload(workload, n, f"c{c}", max_new_tokens, unique_prefix)
        try:
            records, dur = await run_batch(target, bodies, c, api_key, timeout, pool=pool,
                                           quickack=quickack)
        finally:
            if pool is not None:
                pool.close()
        accept = await server_accept_length(base_url, api_key)
        m = level_metrics(records, dur, accept_length=accept, concurrency=c)
        m["warmup_requests"] = w
        m["max_concurrency"] = c
        levels.append(m)
        if log:
            log(f"concurrency {c}: {m['completed']}/{n} ok, "
                f"{m['output_throughput']:.1f} output tok/s, errors {m['errors']}")
        if m["completed"] == 0:
            status = "failed"
            evidence = {"reason": f"every request failed at concurrency {c}",
                        "errors": m["error_messages"]}
            break
    return {"levels": levels, "status": status, "evidence": evidence}


# ---------------------------------------------------------------------------------------------
# What a results file says about the server (the report itself: bin/ddtree_bench_report.py)
# ---------------------------------------------------------------------------------------------

def candidate_from_server_info(info: dict):
    if not isinstance(info, dict):
        return None
    algo = info.get("speculative_algorithm")
    if not algo:
        return "NONE" if "speculative_algorithm" in info else None
    algo = str(algo).upper()
    if algo == "DFLASH" and info.get("speculative_dflash_enable_ddtree"):
        return "DDTREE"
    return algo


# Read from /server_info, which holds every argument (the API key in clear, as the real server
# answers whoever holds the key): only these names go into a results file.
FLAG_KEYS = ("speculative_algorithm", "speculative_dflash_enable_ddtree",
             "speculative_ddtree_budget",
             "speculative_draft_model_path", "speculative_num_steps",
             "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size",
             "attention_backend", "mem_fraction_static", "max_running_requests",
             "cuda_graph_max_bs_decode", "cuda_graph_backend_decode", "disable_cuda_graph",
             "kv_cache_dtype", "dtype", "context_length")


def flags_from_server_info(info: dict) -> list:
    out = []
    if not isinstance(info, dict):
        return out
    for k in FLAG_KEYS:
        v = info.get(k)
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        out.append(flag if v is True else f"{flag} {v}")
    return out
