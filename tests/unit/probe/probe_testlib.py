"""Helpers for the probe tests: the collection's root and a tiny SGLang-like
streaming HTTP server bound to 127.0.0.1 (stdlib only)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
COLLECTIONS = os.path.join(REPO, "collections")

KNOWN_ANSWERS = {
    "What is 2 + 2? Answer with a number only.": "4",
    "What is the capital of France? Answer in one word.": "Paris.",
    "List the first five prime numbers, separated by commas.": "2, 3, 5, 7, 11",
    "Write a Python function named square that returns the square of its argument.":
        "```python\ndef square(x):\n    return x * x\n```",
    "Explain in a few sentences why speculative decoding makes large language model "
    "inference faster.":
        "A small draft model proposes several tokens cheaply, and the large model "
        "verifies them in a single forward pass. When most drafted tokens are accepted, "
        "the large model produces several tokens per step instead of one, so the "
        "wall-clock time per token drops while the output stays the same.",
}


def good_answer(prompt: str) -> str:
    return KNOWN_ANSWERS.get(prompt, "This is a perfectly ordinary answer to your question.")


def token_id(token: str) -> int:
    """A stable id per token text (never 0, which is "!" in GPT-2 style vocabularies)."""
    return 1 + zlib.crc32(token.encode()) % 150000


def split_tokens(text: str) -> list[str]:
    """Crude tokenizer: words with their leading whitespace, max 4 chars each."""
    out = []
    buf = ""
    for ch in text:
        if (ch.isspace() and buf and not buf.isspace()) or len(buf) >= 4:
            out.append(buf)
            buf = ""
        buf += ch
    if buf:
        out.append(buf)
    return out


class Behaviour:
    """What the fake server does.  Tests set attributes on it."""

    def __init__(self):
        self.answer = good_answer          # prompt -> full answer text
        self.token_delay = 0.001           # seconds between streamed tokens
        self.first_delay = 0.0             # seconds before the first token
        # ok | http500 | reset | hang | headers_only | silent | nonstream | incremental
        self.mode = "ok"
        self.output_ids = None             # n -> list of ids (default: from each token's text)
        # (prompt, position) -> the top-1 minus top-2 logprob sent in output_top_logprobs when the
        # request asks for logprobs; None sends no logprobs at all.
        self.margin = lambda prompt, i: 5.0
        self.hang_after = 3                # tokens before hanging (mode hang)
        self.api_key = None                # require Bearer key
        self.spec_accept_length = 3.2
        # Tokens per stream event (one event per scheduler step: several under speculative
        # decoding); token_delay stays per token, so an event comes every step * token_delay.
        self.step = 1
        self.spec_every_chunk = False      # True: spec_* on every chunk (SGLang: the final only)
        self.running_usage = True          # completions: usage on each chunk if asked for
        self.token_ids = False             # completions: choices[0].token_ids per chunk
        self.final_usage = True            # completions: the include_usage chunk at the end
        self.avg_spec_accept_length = 3.1
        self.requests = []                 # (path, headers dict, body dict)
        self.sent = []                     # (time.monotonic(), tokens so far) per event written
        self.stop = threading.Event()


def make_handler(beh: Behaviour):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # keep pytest output clean
            pass

        def _auth_ok(self):
            if beh.api_key is None:
                return True
            return self.headers.get("Authorization") == "Bearer " + beh.api_key

        def _json(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            beh.requests.append((self.path, dict(self.headers), None))
            if not self._auth_ok():
                return self._json(401, {"error": "Unauthorized"})
            if self.path in ("/server_info", "/get_server_info"):
                return self._json(200, {
                    "version": "0.5.23", "speculative_algorithm": "DFLASH",
                    "model_path": "/models/test", "api_key": "SERVER-SIDE-SECRET",
                    "internal_states": [{"avg_spec_accept_length": beh.avg_spec_accept_length,
                                         "last_gen_throughput": 123.4}]})
            if self.path == "/v1/models":
                return self._json(200, {"data": [{"id": "test-model"}]})
            return self._json(404, {"error": "not found"})

        def _chunk(self, data: bytes):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            beh.requests.append((self.path, dict(self.headers), body))
            if beh.mode == "silent":            # accept the request, never answer
                beh.stop.wait(60)
                return
            if beh.mode == "reset":
                # RST instead of FIN: SO_LINGER with zero timeout.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.connection.close()
                return
            if not self._auth_ok():
                return self._json(401, {"error": {"message": "Unauthorized"}})
            if beh.mode == "http500":
                return self._json(500, {"error": {"message": "CUDA error: an illegal memory access"}})
            completions = self.path.startswith("/v1/completions")
            if completions:
                prompt = body.get("prompt", "")
                max_tokens = int(body.get("max_tokens", 16))
            else:
                prompt = body.get("text", "")
                max_tokens = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
            answer = beh.answer(prompt)
            tokens = split_tokens(answer)
            finish = "stop"
            if len(tokens) > max_tokens:
                tokens = tokens[:max_tokens]
                finish = "length"
            if beh.mode == "nonstream":          # ignores stream=true, one JSON body
                return self._json(200, {"text": "".join(tokens),
                                        "output_ids": [token_id(t) for t in tokens],
                                        "meta_info": {"completion_tokens": len(tokens),
                                                      "finish_reason": {"type": finish}}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if beh.first_delay:
                if beh.stop.wait(beh.first_delay):
                    return
            if beh.mode == "headers_only":
                beh.stop.wait(60)
                return
            text = ""
            running_usage = (beh.running_usage and completions and
                             (body.get("stream_options") or {}).get("continuous_usage_stats"))
            step = max(1, int(beh.step))
            ends = list(range(step, len(tokens), step)) + ([len(tokens)] if tokens else [])
            try:
                prev = 0
                for k, n in enumerate(ends):
                    if k and beh.token_delay:
                        if beh.stop.wait(beh.token_delay * (n - prev)):
                            return
                    if beh.mode == "hang" and n > beh.hang_after:
                        if prev >= beh.hang_after or k == 0:
                            beh.stop.wait(60)
                            return
                        n = beh.hang_after
                    tok = "".join(tokens[prev:n])
                    text += tok
                    last = n == len(tokens)
                    if completions:
                        choice = {"index": 0, "text": tok, "finish_reason": finish if last else None}
                        if beh.token_ids:
                            choice["token_ids"] = [token_id(t) for t in tokens[prev:n]]
                        obj = {"id": "cmpl-1", "object": "text_completion", "model": "test-model",
                               "choices": [choice]}
                        if running_usage:
                            obj["usage"] = {"prompt_tokens": 12, "completion_tokens": n}
                    else:
                        meta = {"id": "req-1", "prompt_tokens": 12, "completion_tokens": n,
                                "finish_reason": {"type": finish} if last else None,
                                "num_retractions": 0, "reasoning_tokens": 0}
                        if last or beh.spec_every_chunk:
                            meta.update(spec_accept_length=beh.spec_accept_length,
                                        spec_verify_ct=max(1, n // 3))
                        ids = (beh.output_ids(n) if beh.output_ids
                               else [token_id(t) for t in tokens[:n]])
                        if body.get("return_logprob") and beh.margin is not None:
                            meta["output_top_logprobs"] = [
                                [[-0.1, ids[i], None], [-0.1 - beh.margin(prompt, i), 7, None]]
                                for i in range(n)]
                        obj = {"text": text, "output_ids": ids, "meta_info": meta}
                        if beh.mode == "incremental":   # --incremental-streaming-output
                            obj = {"text": tok, "output_ids": ids[prev:n], "meta_info": meta}
                    self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    beh.sent.append((time.monotonic(), n))
                    prev = n
                    if beh.mode == "hang" and n >= beh.hang_after and not last:
                        beh.stop.wait(60)
                        return
                if completions and beh.final_usage:
                    usage = {"choices": [], "usage": {"prompt_tokens": 12,
                                                       "completion_tokens": len(tokens)}}
                    self._chunk(b"data: " + json.dumps(usage).encode() + b"\n\n")
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                return

    return Handler


class FakeServer:
    def __init__(self):
        self.beh = Behaviour()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.beh))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self):
        self.beh.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


