# -*- coding: utf-8 -*-
"""Generation-quality probe for SGLang servers (stdlib only).

A server can answer /health with 200 and still emit "!!!!!!!!" at 0.057 tokens/s.
``run_probe()`` streams known-answer prompts through ``/generate`` (or ``/v1/completions``),
measures time to first token, inter-chunk gaps and tokens/s, stops early when the server stalls
or crawls, judges the text (``ddtree_textcheck.assess``), reads ``/server_info`` for the
speculative accept length and compares with a baseline report: the speed ratio, and each greedy
output token by token (``probe/agreement``: a confident early divergence is a lossless
violation).  The JSON-serialisable report's ``verdict`` is ``pass``, ``fail`` (the server is
broken) or ``inconclusive`` (the probe could not measure: nothing listening, credentials
refused, no data).  HTTP on the wire is ``http/client``'s.

Imported by the sglang_probe module and by the ddtree-probe CLI (plugins/plugin_utils/cli/probe.py),
by its collection name: no ansible imports, python3 stdlib only.
"""

from __future__ import annotations

import datetime
import json
import os.path
import re
import ssl
import statistics
import time

from ansible_collections.ddtree.fleet.plugins.module_utils.http.client import (BadURL, ConnectionClosed, HttpError, HttpTimeout,
                                                                       ProtocolError, Stream, Unreachable,
                                                                       get_json, parse_base_url, redact_url)
from ansible_collections.ddtree.fleet.plugins.module_utils.probe import agreement as agreement_rules
from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck.judge import assess, judges, same_output_reasons

PASS = "pass"
FAIL = "fail"
INCONCLUSIVE = "inconclusive"
NOT_RUN = "not_run"

# Defaults (also the names of run_probe's keyword arguments).
DEFAULT_MIN_TOKENS_PER_S = 5.0
DEFAULT_STALL_TIMEOUT = 5.0
DEFAULT_TTFT_TIMEOUT = 8.0
DEFAULT_RATE_WINDOW_S = 3.0
DEFAULT_REQUEST_TIMEOUT = 120.0
# Early fail when, after rate_window_s, the rate is below this share of the floor.
EARLY_RATE_FRACTION = 0.25
# Answers shorter than this are not judged on speed (a 1-token "4" has no rate).
MIN_TOKENS_FOR_RATE = 8
DEFAULT_MAX_TOKENS = 64
# Alternatives per output token asked of /generate (return_logprob): the baseline's top-2 margin
# tells a near tie (numerics) from a lossless violation (probe/agreement).
DEFAULT_TOP_LOGPROBS = 2
EXCERPT_CHARS = 200
OUTPUT_KEEP_CHARS = 4000
DIVERGENCE_CONTEXT = 30
SERVER_INFO_TIMEOUT = 5.0
USER_AGENT = "ddtree-probe/1"

# roles/quality_gate/files/default_prompts.json's prompts (a test keeps them equal).
DEFAULT_PROMPTS = [
    {"name": "arith", "prompt": "What is 2 + 2? Answer with a number only.",
     "expect": "4\\.?", "max_tokens": 8},
    {"name": "capital", "prompt": "What is the capital of France? Answer in one word.",
     "expect": "Paris\\.?", "max_tokens": 8},
    {"name": "primes", "prompt": "List the first five prime numbers, separated by commas.",
     "expect": "2,\\s*3,\\s*5,\\s*7,\\s*11\\.?", "max_tokens": 24},
    {"name": "code", "prompt": "Write a Python function named square that returns the "
                               "square of its argument.", "max_tokens": 64},
    {"name": "freeform", "prompt": "Explain in a few sentences why speculative decoding makes "
                                   "large language model inference faster.", "max_tokens": 96},
]

_SERVER_INFO_KEYS = ("version", "model_path", "served_model_name", "speculative_algorithm",
                     "speculative_num_steps", "speculative_eagle_topk",
                     "speculative_num_draft_tokens", "speculative_draft_model_path",
                     "tp_size", "attention_backend", "dtype", "kv_cache_dtype",
                     "max_running_requests", "context_length")
_INTERNAL_STATE_KEYS = ("avg_spec_accept_length", "last_gen_throughput", "memory_usage")


class ProbeError(Exception):
    """Bad arguments or prompts: the probe cannot run."""


# --------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------

def normalise_prompts(prompts) -> list[dict]:
    """Validate a prompt list; returns dicts with name, prompt, expect, max_tokens."""
    if prompts is None:
        prompts = DEFAULT_PROMPTS
    if not isinstance(prompts, list) or not prompts:
        raise ProbeError("prompts must be a non-empty list of objects with a 'prompt' key")
    out = []
    names = set()
    for i, item in enumerate(prompts):
        if isinstance(item, str):
            item = {"prompt": item}
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) \
                or not item["prompt"].strip():
            raise ProbeError("prompts[%d] must be an object with a non-empty string 'prompt'" % i)
        expect = item.get("expect")
        if expect is not None:
            if not isinstance(expect, str):
                raise ProbeError("prompts[%d].expect must be a regex string" % i)
            try:
                re.compile(expect)
            except re.error as exc:
                raise ProbeError("prompts[%d].expect is not a valid regex: %s" % (i, exc))
        try:        # an int or its digits; not a bool or a float
            max_tokens = int(str(item.get("max_tokens", DEFAULT_MAX_TOKENS)))
        except ValueError:
            max_tokens = 0
        if max_tokens < 1:
            raise ProbeError("prompts[%d].max_tokens must be a positive integer" % i)
        name = str(item.get("name") or "prompt%d" % (i + 1))
        if name in names:
            name = "%s#%d" % (name, i + 1)
        names.add(name)
        out.append({"name": name, "prompt": item["prompt"], "expect": expect,
                    "max_tokens": max_tokens})
    return out


def load_prompts_file(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ProbeError("cannot read prompts file %s: %s" % (path, exc.strerror or exc))
    except ValueError as exc:
        raise ProbeError("prompts file %s is not valid JSON: %s" % (path, exc))
    return normalise_prompts(data)


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

def redact(obj, secrets):
    """Return a deep copy of obj with every secret substring replaced."""
    secrets = [s for s in secrets if s]
    if not secrets:
        return obj
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, "********")
        return obj
    if isinstance(obj, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, secrets) for v in obj]
    return obj


def _round(v, nd=3):
    return None if v is None else round(float(v), nd)


def first_divergence(baseline: str, candidate: str):
    """Index of the first differing character and the two snippets, or None when equal."""
    if baseline == candidate:
        return None
    i = len(os.path.commonprefix([baseline, candidate]))
    lo = max(0, i - 10)
    return {"index": i,
            "baseline": baseline[lo:i + DIVERGENCE_CONTEXT],
            "candidate": candidate[lo:i + DIVERGENCE_CONTEXT]}


def _target(url):
    """The parsed base URL; a bad one is a ProbeError (the probe cannot run)."""
    try:
        return parse_base_url(url)
    except BadURL as exc:
        raise ProbeError(str(exc)) from None


# --------------------------------------------------------------------------
# one prompt
# --------------------------------------------------------------------------

# Word or punctuation pieces with their leading whitespace: an estimate of how many tokens a
# text delta holds when the server sends neither token ids nor token counts.
_PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")


def estimate_tokens(text: str) -> int:
    """Rough token count of a text delta (at least 1 when it is not empty)."""
    return max(1, len(_PIECE_RE.findall(text))) if text else 0


class _Accumulator:
    """Tracks text and token counts from SGLang /generate or OpenAI stream chunks.

    A chunk is one scheduler step and may carry several tokens (speculative decoding), so
    tokens are counted from ``completion_tokens`` (meta_info or continuous usage), else from
    ``output_ids`` / ``token_ids``, else estimated from the text delta; never one per chunk.
    The spec_* fields come from the finished chunk (SGLang sends them only there); values
    from an earlier chunk are kept only when the finished one has none.
    """

    SPEC_KEYS = ("spec_accept_length", "spec_accept_rate", "spec_verify_ct")

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.text = ""
        self.ids: list = []
        self.margins: list = []
        self.tokens = 0
        self.finish_reason = None
        self.spec_accept_length = None
        self.spec_accept_rate = None
        self.spec_verify_ct = None
        self.error = None
        self._incremental_text = False

    def _spec(self, meta: dict, final: bool) -> None:
        got = {k: meta[k] for k in self.SPEC_KEYS if meta.get(k) is not None}
        if not got:
            return
        if final or self.finish_reason is None:
            for k, v in got.items():
                setattr(self, k, v if k == "spec_verify_ct" else float(v))
        if final and self.spec_accept_length is None and self.spec_verify_ct:
            self.spec_accept_length = self.tokens / float(self.spec_verify_ct)

    def feed(self, obj) -> bool:
        """Apply one decoded `data:` object; True when it carried new tokens."""
        before = (self.tokens, len(self.text))
        if not isinstance(obj, dict):
            return False
        if obj.get("error"):
            err = obj["error"]
            self.error = err.get("message") if isinstance(err, dict) else str(err)
            return False
        if self.endpoint == "completions":
            usage = obj.get("usage")
            counted = isinstance(usage, dict) and usage.get("completion_tokens") is not None
            if counted:
                # continuous_usage_stats: the running count on every chunk (and the final usage)
                self.tokens = max(self.tokens, int(usage["completion_tokens"]))
            choices = obj.get("choices") or []
            choice = choices[0] if choices and isinstance(choices[0], dict) else {}
            ids = choice.get("token_ids")
            if isinstance(ids, list) and ids:
                self.ids.extend(ids)
                if not counted:
                    self.tokens = max(self.tokens, len(self.ids))
                    counted = True
            delta = choice.get("text") or ""
            if delta:
                self.text += delta
                if not counted:
                    self.tokens += estimate_tokens(delta)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        else:
            text = obj.get("text")
            if isinstance(text, str):
                if self._incremental_text or (self.text and not text.startswith(self.text)):
                    self._incremental_text = True
                    self.text += text
                else:
                    self.text = text
            meta = obj.get("meta_info") or {}
            ids = obj.get("output_ids")
            ct = meta.get("completion_tokens")
            if isinstance(ids, list):
                if ct is not None and len(self.ids) + len(ids) == ct and len(ids) != ct:
                    self.ids.extend(ids)
                else:
                    self.ids = list(ids)
            top = meta.get("output_top_logprobs")
            if isinstance(top, list) and top:
                new = agreement_rules.margins_from_top_logprobs(top)
                if len(self.margins) + len(new) == len(self.ids) and len(new) != len(self.ids):
                    self.margins.extend(new)      # incremental streaming output
                else:
                    self.margins = new
            if ct is not None:
                self.tokens = max(self.tokens, int(ct))
            elif isinstance(ids, list):
                self.tokens = max(self.tokens, len(self.ids))
            elif len(self.text) > before[1]:
                self.tokens += estimate_tokens(self.text[before[1]:])
            final = bool(meta.get("finish_reason"))
            if final:
                fr = meta["finish_reason"]
                self.finish_reason = fr.get("type") if isinstance(fr, dict) else fr
            self._spec(meta, final)
        return (self.tokens, len(self.text)) != before


def _request_for(endpoint, item, model, top_logprobs=0):
    if endpoint == "completions":
        path = "/v1/completions"
        body = {"model": model or "default", "prompt": item["prompt"],
                "max_tokens": item["max_tokens"], "temperature": 0, "stream": True,
                # a running completion_tokens on every chunk: a chunk may hold several tokens
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    else:
        path = "/generate"
        body = {"text": item["prompt"],
                "sampling_params": {"temperature": 0, "max_new_tokens": item["max_tokens"],
                                    "repetition_penalty": 1.0, "frequency_penalty": 0.0,
                                    "presence_penalty": 0.0},
                "stream": True}
        if top_logprobs:
            body.update(return_logprob=True, top_logprobs_num=top_logprobs)
    return path, json.dumps(body).encode()


def worst_case_seconds(prompts=None, *, min_tokens_per_s=DEFAULT_MIN_TOKENS_PER_S, stall_timeout=DEFAULT_STALL_TIMEOUT,
                       ttft_timeout=DEFAULT_TTFT_TIMEOUT, rate_window_s=DEFAULT_RATE_WINDOW_S,
                       request_timeout=DEFAULT_REQUEST_TIMEOUT) -> float:
    """The longest one probe of ``prompts`` can take before its verdict, from the limits that end a
    prompt: the first token within ``ttft_timeout``; then a stream kept only while its rate stays at
    or above EARLY_RATE_FRACTION of the floor (so ``max_tokens`` at that rate), with a stall of up to
    ``stall_timeout`` at its end; never past ``request_timeout``. Plus the /server_info and
    /v1/models reads. The watchdog of a change must outlast every probe of its gate (role known_good)."""
    slowest = EARLY_RATE_FRACTION * float(min_tokens_per_s)
    total = 2 * SERVER_INFO_TIMEOUT
    for item in normalise_prompts(prompts):
        stream = item["max_tokens"] / slowest if slowest > 0 else float(request_timeout)
        total += min(float(request_timeout), float(ttft_timeout) + max(float(rate_window_s), stream) + float(stall_timeout))
    return total


def probe_prompt(url, item, *, api_key=None, endpoint="generate", model=None,
                 min_tokens_per_s=DEFAULT_MIN_TOKENS_PER_S, stall_timeout=DEFAULT_STALL_TIMEOUT,
                 ttft_timeout=DEFAULT_TTFT_TIMEOUT, rate_window_s=DEFAULT_RATE_WINDOW_S,
                 request_timeout=DEFAULT_REQUEST_TIMEOUT, prior_tokens=0, prior_seconds=0.0,
                 top_logprobs=DEFAULT_TOP_LOGPROBS) -> dict:
    """Stream one prompt and judge it.

    ``prior_tokens`` / ``prior_seconds`` are the totals of the prompts already run: once
    their sum with this request reaches ``rate_window_s`` the cumulative rate is judged
    too, so a crawling server is caught even while it answers one-token prompts.

    Returns a result dict with ``verdict`` (pass|fail|inconclusive), ``reasons``,
    measurements, the full ``output`` and ``reached`` (did the server answer at all).
    """
    res = {"name": item["name"], "prompt": item["prompt"], "expect": item.get("expect"),
           "max_tokens": item["max_tokens"], "verdict": None, "text_verdict": None,
           "reasons": [], "excerpt": "", "output": "", "completion_tokens": 0,
           "ttft_s": None, "tokens_per_s": None, "elapsed_s": None, "max_gap_s": None,
           "finish_reason": None, "spec_accept_length": None, "http_status": None,
           "reached": False}
    path, body = _request_for(endpoint, item, model, top_logprobs)
    acc = _Accumulator(endpoint)
    t0 = time.monotonic()
    hard_deadline = t0 + request_timeout
    first_t = None
    first_tokens = 0
    last_t = None
    max_gap = 0.0
    # Most tokens one event brought: a scheduler step may add several (speculative decoding),
    # so the early rate checks allow for the next step's tokens arriving right now.
    max_step = 0
    floor = EARLY_RATE_FRACTION * (min_tokens_per_s or 0)     # the early-fail rate
    early = None          # (verdict, reason) when the probe gave up early
    stream = Stream(_target(url), USER_AGENT)
    saw_done = False

    try:
        stream.connect(min(ttft_timeout, request_timeout))
        res["reached"] = True
        stream.send("POST", path, body, headers={"Accept": "text/event-stream"},
                    api_key=api_key)
        stream.read_head(min(t0 + ttft_timeout, hard_deadline))
        res["http_status"] = st = stream.status
        if st in (401, 403):
            early = (INCONCLUSIVE, "unauthorized: HTTP %d from %s (API key missing or wrong)"
                     % (st, path))
        elif st == 429:
            early = (INCONCLUSIVE, "busy: HTTP 429 from %s" % path)
        elif st != 200:
            # 5xx: the server is broken; other 4xx: it rejects a valid probe request.  The
            # start of the error body goes into the reason.
            err = b""
            try:
                end = min(time.monotonic() + 2.0, hard_deadline)
                while len(err) < 2000:
                    chunk = stream.read_body(end)
                    if not chunk:
                        break
                    err += chunk
            except (HttpError, OSError):
                pass
            detail = err.decode("utf-8", "replace").strip().replace("\n", " ")[:200]
            early = (FAIL, "http_error: HTTP %d from %s: %s" % (st, path, detail))
        else:
            ctype = stream.headers.get("content-type", "")
            headers_t = time.monotonic()
            buf = b""
            rate_checked = False
            while True:
                now = time.monotonic()
                if first_t is None:
                    # The stream is open: a healthy server sends its first token within
                    # stall_timeout (short prompts prefill in milliseconds); ttft_timeout
                    # caps the whole wait from the request.
                    deadline = min(t0 + ttft_timeout, headers_t + stall_timeout)
                else:
                    deadline = last_t + stall_timeout
                deadline = wake = min(deadline, hard_deadline)
                if min_tokens_per_s:
                    if first_t is not None and not rate_checked:
                        wake = min(wake, first_t + rate_window_s)
                    wake = min(wake, max(now + 0.2, t0 + rate_window_s - prior_seconds))
                try:
                    data = stream.read_body(wake)
                except HttpTimeout:
                    now = time.monotonic()
                    if now >= deadline - 1e-3:
                        if now >= hard_deadline - 1e-3:
                            early = (FAIL, "request_timeout: generation not finished after "
                                           "%.1f s (%d tokens)" % (request_timeout, acc.tokens))
                        elif first_t is None and now - t0 >= ttft_timeout - 1e-3:
                            early = (FAIL, "ttft_timeout: no token within %.1f s" % ttft_timeout)
                        elif first_t is None:
                            early = (FAIL, "stall: no token for %.1f s after the response "
                                           "headers (0 tokens)" % (now - headers_t))
                        else:
                            early = (FAIL, "stall: no token for %.1f s after %d tokens"
                                     % (now - last_t, acc.tokens))
                        break
                    data = None
                if data == b"":
                    break
                if data:
                    buf += data
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        line = line.strip()
                        if not line or line.startswith(b":"):
                            continue
                        if line.startswith(b"data:"):
                            payload = line[5:].strip()
                        elif "json" in ctype and line.startswith((b"{", b"[")):
                            payload = line
                        else:
                            continue
                        if payload == b"[DONE]":
                            saw_done = True
                            continue
                        try:
                            obj = json.loads(payload.decode("utf-8", "replace"))
                        except ValueError:
                            continue
                        tokens_before = acc.tokens
                        progressed = acc.feed(obj)
                        max_step = max(max_step, acc.tokens - tokens_before)
                        if acc.error:
                            early = (FAIL, "stream_error: %s" % str(acc.error)[:200])
                            break
                        if progressed:
                            t = time.monotonic()
                            if first_t is None:
                                first_t = t
                                first_tokens = acc.tokens
                            else:
                                max_gap = max(max_gap, t - last_t)
                            last_t = t
                    if early or saw_done:
                        break
                # Early rate checks once the window has elapsed: this request's decode rate,
                # and the rate over all prompts so far (TTFT included); before any token at
                # all, the TTFT and stall limits decide.  Both give the server the benefit of
                # one more step arriving now, so a stream of large steps is not failed between
                # two of them.
                now = time.monotonic()
                cum_s = prior_seconds + (now - t0)
                if (min_tokens_per_s and cum_s >= rate_window_s and not acc.finish_reason
                        and prior_tokens + acc.tokens > 0):
                    cum_rate = (prior_tokens + acc.tokens + max(1, max_step)) / cum_s
                    if cum_rate < floor:
                        early = (FAIL, "rate_too_low: %.2f tokens/s over %.1f s of generation "
                                       "across prompts (floor %g, early fail below %g)"
                                 % (cum_rate, cum_s, min_tokens_per_s, floor))
                        break
                if first_t is not None and min_tokens_per_s and now - first_t >= rate_window_s:
                    rate_checked = True
                    rate = ((acc.tokens - first_tokens + max(1, max_step))
                            / max(1e-6, now - first_t))
                    if rate < floor and not acc.finish_reason:
                        early = (FAIL, "rate_too_low: %.2f tokens/s after %.1f s (floor %g, early "
                                       "fail below %g)" % (rate, now - first_t, min_tokens_per_s,
                                                           floor))
                        break
            if buf.strip() and not acc.text and "json" in ctype:
                # Server ignored stream=true and sent one JSON body.
                try:
                    acc.feed(json.loads(buf.decode("utf-8", "replace")))
                    first_t = last_t = time.monotonic()
                except ValueError:
                    pass
    except Unreachable as exc:
        early = (INCONCLUSIVE, "unreachable: %s" % exc)
        res["error_kind"] = exc.kind
    except (ConnectionClosed, ProtocolError) as exc:
        early = (FAIL, "connection_closed: %s (%d tokens received)" % (exc, acc.tokens))
    except HttpTimeout:
        # Only read_head can raise here: no response within ttft_timeout.
        early = (FAIL, "ttft_timeout: no response headers within %.1f s" % ttft_timeout)
    except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
        early = (FAIL, "connection reset during generation (%d tokens received)" % acc.tokens)
    except ssl.SSLError as exc:
        early = (INCONCLUSIVE, "tls_error: %s" % exc)
    except OSError as exc:
        early = (FAIL, "io_error: %s" % (exc.strerror or exc))
    finally:
        stream.close()

    now = time.monotonic()
    res["elapsed_s"] = _round(now - t0)
    res["completion_tokens"] = acc.tokens
    rate = None
    if first_t is not None:
        res["ttft_s"] = _round(first_t - t0)
        res["max_gap_s"] = _round(max_gap)
        span = last_t - first_t
        if span > 0.01 and acc.tokens > first_tokens:
            rate = (acc.tokens - first_tokens) / span
        elif acc.tokens and now > t0:
            rate = acc.tokens / max(1e-6, (last_t - t0))
    res["tokens_per_s"] = _round(rate, 2)
    res["finish_reason"] = acc.finish_reason
    res["spec_accept_length"] = acc.spec_accept_length
    res["output"] = acc.text[:OUTPUT_KEEP_CHARS]
    if acc.ids:
        res["output_ids"] = list(acc.ids)
    if acc.margins:
        res["top_margins"] = list(acc.margins)
    res["excerpt"] = acc.text[:EXCERPT_CHARS]
    if early is not None:
        res["verdict"], reason = early
        res["reasons"].append(reason)
        if acc.text:
            tv, tr = assess(acc.text, expect=None, output_ids=acc.ids or None)
            if tv == "degenerate":
                res["reasons"].extend("degenerate: " + r for r in tr)
        return res

    if not saw_done and not acc.finish_reason:
        res["verdict"] = FAIL
        res["reasons"].append("connection_closed: stream ended without [DONE] after %d tokens"
                              % acc.tokens)
        return res

    tv, tr = assess(acc.text, prompt=item["prompt"], expect=item.get("expect"),
                    output_ids=acc.ids or None, finish_reason=acc.finish_reason,
                    max_tokens=item["max_tokens"])
    res["text_verdict"] = tv
    reasons = ["%s: %s" % (tv, r) for r in tr]
    if (min_tokens_per_s and res["tokens_per_s"] is not None
            and acc.tokens >= MIN_TOKENS_FOR_RATE and res["tokens_per_s"] < min_tokens_per_s):
        reasons.append("slow: %.2f tokens/s < floor %g" % (res["tokens_per_s"], min_tokens_per_s))
    res["reasons"].extend(reasons)
    res["verdict"] = FAIL if reasons else PASS
    return res


# --------------------------------------------------------------------------
# /server_info and /v1/models
# --------------------------------------------------------------------------

def fetch_server_info(url, api_key=None) -> dict:
    """A safe subset of /server_info (never the server's api_key or other args)."""
    for path in ("/server_info", "/get_server_info"):
        try:
            status, data = get_json(url, path, api_key, SERVER_INFO_TIMEOUT,
                                    user_agent=USER_AGENT)
        except HttpError as exc:
            return {"error": "%s: %s" % (path, exc)}
        if status == 404 and path == "/server_info":
            continue        # an older SGLang: /get_server_info
        if status != 200:
            return {"error": "HTTP %d from %s" % (status, path)}
        if not isinstance(data, dict):
            return {"error": "%s: not a JSON object" % path}
        info = {"source": path}
        for k in _SERVER_INFO_KEYS:
            if k in data and isinstance(data[k], (str, int, float, bool, type(None))):
                info[k] = data[k]
        states = data.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], dict):
            info["internal_states"] = [{k: s.get(k) for k in _INTERNAL_STATE_KEYS if k in s}
                                       for s in states if isinstance(s, dict)]
            acc = states[0].get("avg_spec_accept_length")
            info["avg_spec_accept_length"] = float(acc) if acc is not None else None
        return info


def _first_model_id(url, api_key):
    try:
        status, data = get_json(url, "/v1/models", api_key, SERVER_INFO_TIMEOUT,
                                user_agent=USER_AGENT)
        return data["data"][0]["id"] if status == 200 else None
    except (HttpError, KeyError, IndexError, TypeError):
        return None


# --------------------------------------------------------------------------
# baseline
# --------------------------------------------------------------------------

def _rate_ok(p):
    return (p.get("tokens_per_s") and p.get("verdict") == PASS
            and (p.get("completion_tokens") or 0) >= MIN_TOKENS_FOR_RATE)


def compare_with_baseline(prompts: list[dict], baseline: dict, min_speed_ratio=None,
                          agreement=None):
    """Compare per-prompt results with a baseline report.

    Speed: the median per-prompt tokens/s ratio against ``min_speed_ratio``.  Agreement: each
    prompt's greedy output against the baseline's under the ``agreement`` rule
    (probe/agreement: a confident early divergence is a lossless violation, a near tie is not).
    Returns (section, fail_reasons, inconclusive_reasons, warnings).
    """
    rule = agreement or agreement_rules.default_rule()
    section = {"url": baseline.get("url"), "verdict": baseline.get("verdict"),
               "started_at": baseline.get("started_at"), "prompts": [],
               "speed_ratio": None, "min_speed_ratio": min_speed_ratio, "agreement": rule,
               "warnings": []}
    fails, inconcl = [], []
    base_prompts = baseline.get("prompts") or []
    by_name = {p.get("name"): p for p in base_prompts if isinstance(p, dict)}
    by_text = {p.get("prompt"): p for p in base_prompts if isinstance(p, dict)}
    baseline_ok = baseline.get("verdict") == PASS
    if not baseline_ok:
        section["warnings"].append("baseline_not_passing: baseline verdict is %r; its outputs "
                                   "and speed are not trusted" % baseline.get("verdict"))
    ratios, judged = [], []
    for p in prompts:
        if p.get("verdict") == NOT_RUN:
            continue
        b = by_name.get(p["name"]) or by_text.get(p["prompt"])
        entry = {"name": p["name"]}
        section["prompts"].append(entry)
        if b is None:
            entry["missing_in_baseline"] = True
            continue
        b_out = b.get("output") if b.get("output") is not None else b.get("excerpt", "")
        c_out = p.get("output") if p.get("output") is not None else p.get("excerpt", "")
        div = first_divergence(b_out.strip(), c_out.strip())
        entry["identical"] = div is None
        entry["first_divergence"] = div
        if p.get("verdict") == PASS and rule["mode"] != "off":
            entry["agreement"] = agreement_rules.compare(b, p, rule)
            judged.append((p["name"], entry["agreement"]))
        if _rate_ok(p) and _rate_ok(b):
            r = p["tokens_per_s"] / b["tokens_per_s"]
            entry["speed_ratio"] = _round(r)
            ratios.append(r)
    if ratios:
        section["speed_ratio"] = _round(statistics.median(ratios))
    if baseline_ok:
        agree_fails, agree_warns = agreement_rules.judge(judged, rule)
        fails.extend(agree_fails)
        section["warnings"].extend(agree_warns)
    if min_speed_ratio and baseline_ok:     # (a broken baseline cannot fail the candidate)
        if section["speed_ratio"] is None:
            inconcl.append("speed_ratio_unavailable: no prompt with >= %d tokens has a rate in "
                           "both reports" % MIN_TOKENS_FOR_RATE)
        elif section["speed_ratio"] < min_speed_ratio:
            fails.append("speed_ratio: %.2f of baseline < floor %g" % (
                section["speed_ratio"], min_speed_ratio))
    return section, fails, inconcl, list(section["warnings"])


# --------------------------------------------------------------------------
# the whole probe
# --------------------------------------------------------------------------

def run_probe(url, prompts=None, *, api_key=None, endpoint="generate", model=None,
              min_tokens_per_s=DEFAULT_MIN_TOKENS_PER_S, stall_timeout=DEFAULT_STALL_TIMEOUT,
              ttft_timeout=DEFAULT_TTFT_TIMEOUT, rate_window_s=DEFAULT_RATE_WINDOW_S,
              request_timeout=DEFAULT_REQUEST_TIMEOUT, min_accept_length=None,
              baseline=None, min_speed_ratio=None, agreement=None,
              top_logprobs=DEFAULT_TOP_LOGPROBS) -> dict:
    """Probe a server and return the report dict (see module docstring)."""
    start = time.monotonic()
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if endpoint not in ("generate", "completions"):
        raise ProbeError("endpoint must be 'generate' or 'completions', got %r" % endpoint)
    for name, val in (("stall_timeout", stall_timeout), ("ttft_timeout", ttft_timeout),
                      ("rate_window_s", rate_window_s), ("request_timeout", request_timeout)):
        if val is None or float(val) <= 0:
            raise ProbeError("%s must be > 0" % name)
    if baseline is not None and not isinstance(baseline, dict):
        raise ProbeError("baseline must be a previous report (a dict)")
    if agreement is None or isinstance(agreement, str):
        agreement = agreement_rules.make_rule(mode=agreement)
    elif isinstance(agreement, dict):
        agreement = agreement_rules.make_rule(**{k: agreement.get(k) for k in
                                                 ("mode", "tokens", "near_tie_margin",
                                                  "max_late")})
    else:
        raise ProbeError("agreement must be a mode (%s) or a rule dict"
                         % ", ".join(agreement_rules.MODES))
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
        raise ProbeError("top_logprobs must be an integer >= 0")
    items = normalise_prompts(prompts)
    _target(url)

    thresholds = {"min_tokens_per_s": min_tokens_per_s, "stall_timeout": stall_timeout,
                  "ttft_timeout": ttft_timeout, "rate_window_s": rate_window_s,
                  "request_timeout": request_timeout, "min_accept_length": min_accept_length,
                  "min_speed_ratio": min_speed_ratio, "agreement": agreement,
                  "top_logprobs": top_logprobs, "early_rate_fraction": EARLY_RATE_FRACTION,
                  "min_tokens_for_rate": MIN_TOKENS_FOR_RATE}
    report = {"verdict": None, "passed": False, "reasons": [], "warnings": [],
              "detection_seconds": None, "started_at": started_at, "url": redact_url(url),
              "endpoint": endpoint, "prompts": [], "not_run": [], "server_info": None,
              "baseline": None, "thresholds": thresholds}
    fails, inconcl = [], []

    if endpoint == "completions":
        report["model"] = model = model or _first_model_id(url, api_key) or "default"

    any_reached = False
    stopped = False
    cum_tokens, cum_seconds = 0, 0.0
    for item in items:
        if stopped:
            report["prompts"].append({"name": item["name"], "prompt": item["prompt"],
                                      "verdict": NOT_RUN, "reasons": []})
            report["not_run"].append(item["name"])
            continue
        res = probe_prompt(url, item, api_key=api_key, endpoint=endpoint, model=model,
                           min_tokens_per_s=min_tokens_per_s, stall_timeout=stall_timeout,
                           ttft_timeout=ttft_timeout, rate_window_s=rate_window_s,
                           request_timeout=request_timeout, prior_tokens=cum_tokens,
                           prior_seconds=cum_seconds, top_logprobs=top_logprobs)
        cum_tokens += res.get("completion_tokens") or 0
        cum_seconds += res.get("elapsed_s") or 0.0
        reached = res.pop("reached")
        if not reached and any_reached:
            # It answered before and now refuses: it died while we probed it.
            res["verdict"] = FAIL
            res["reasons"] = ["server_went_away: " + r.split(": ", 1)[-1] for r in res["reasons"]]
        any_reached = any_reached or reached
        report["prompts"].append(res)
        if res["verdict"] != PASS:
            (fails if res["verdict"] == FAIL else inconcl).extend(
                "%s: %s" % (res["name"], r) for r in res["reasons"])
            stopped = True

    # One answer for different prompts: a server that ignores its prompt.
    if not fails:
        fails.extend(same_output_reasons([(p["name"], p["prompt"], p.get("output") or "")
                                          for p in report["prompts"] if p.get("verdict") == PASS]))
    report["text_judges"] = {"probe": judges()}

    # Speculative acceptance.
    if any_reached:
        report["server_info"] = fetch_server_info(url, api_key)
    acc_values = [(p.get("spec_accept_length"), p.get("completion_tokens") or 0)
                  for p in report["prompts"] if p.get("spec_accept_length") is not None]
    weight = sum(max(1, w) for _, w in acc_values)
    probe_acc = (sum(v * max(1, w) for v, w in acc_values) / weight) if acc_values else None
    server_acc = (report["server_info"] or {}).get("avg_spec_accept_length")
    report["spec_accept_length"] = {"probe_weighted_mean": _round(probe_acc),
                                    "server_avg": _round(server_acc)}
    if min_accept_length and not fails and not inconcl:
        judged = probe_acc if probe_acc is not None else server_acc
        if judged is None:
            inconcl.append("accept_length_unavailable: no spec_accept_length in responses or "
                           "/server_info")
        elif judged < min_accept_length:
            fails.append("accept_length_low: %.2f < floor %g (speculative acceptance collapsed)"
                         % (judged, min_accept_length))

    if baseline is not None:
        section, bf, bi, warns = compare_with_baseline(report["prompts"], baseline,
                                                       min_speed_ratio, agreement)
        report["baseline"] = section
        report["warnings"].extend(warns)
        if not fails:
            fails.extend(bf)
            inconcl.extend(bi)
    elif min_speed_ratio:
        report["warnings"].append("min_speed_ratio set but no baseline given: not checked")

    if fails:
        verdict = FAIL
    elif inconcl or not any(p.get("verdict") == PASS for p in report["prompts"]):
        verdict = INCONCLUSIVE
    else:
        verdict = PASS
    report["verdict"] = verdict
    report["passed"] = verdict == PASS
    report["reasons"] = fails + inconcl
    report["detection_seconds"] = _round(time.monotonic() - start)
    return redact(report, [api_key] if api_key else [])


def rejudge_text(report: dict) -> list:
    """Judge each passing prompt's text again, with this process's ``assess``.

    The probe module runs on the target host with the standard library only; on the controller
    textcheck/judge also has its library-backed judges (plugins/action/sglang_probe.py calls
    this there).  A prompt the judge now finds degenerate or wrong fails, and so does the
    report.  Returns the new fail reasons (empty when nothing changed).
    """
    new = []
    for p in report.get("prompts") or []:
        if p.get("verdict") != PASS:
            continue
        tv, tr = assess(p.get("output") or "", prompt=p.get("prompt"), expect=p.get("expect"),
                        output_ids=p.get("output_ids") or None,
                        finish_reason=p.get("finish_reason"), max_tokens=p.get("max_tokens"))
        if tv == "ok":
            continue
        reasons = ["%s: %s" % (tv, r) for r in tr]
        p["verdict"], p["text_verdict"] = FAIL, tv
        p.setdefault("reasons", []).extend(reasons)
        new.extend("%s: %s" % (p["name"], r) for r in reasons)
    if new:
        report["verdict"], report["passed"] = FAIL, False
        report["reasons"] = new + list(report.get("reasons") or [])
    return new


def verdict_exit_code(verdict: str) -> int:
    return {PASS: 0, FAIL: 1}.get(verdict, 2)
