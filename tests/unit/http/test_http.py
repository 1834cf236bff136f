"""ddtree_http: the one HTTP/1.1 wire format of the probe, the benchmark and the health wait.

The sans-IO pieces with hand-written bytes, the synchronous client against loopback servers
(http.server threads and raw sockets), the modules that use it (sglang_health's health_status,
the probe's /server_info read) and AnsiballZ shipping ddtree_http with the three modules.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import socket
import struct
import threading
import time

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.http import client as h
from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as dp
from ddtree_testlib import LIBRARY, run_adhoc

# ---- parse_base_url ------------------------------------------------------------------------


def test_parse_base_url_parts():
    assert h.parse_base_url("http://127.0.0.1:30000/prefix/") == {
        "scheme": "http", "host": "127.0.0.1", "port": 30000, "prefix": "/prefix",
        "host_header": "127.0.0.1:30000"}
    t = h.parse_base_url("https://Example.org")
    assert (t["scheme"], t["host"], t["port"], t["prefix"], t["host_header"]) == \
        ("https", "example.org", 443, "", "example.org")
    assert h.parse_base_url("http://h")["port"] == 80
    t = h.parse_base_url("http://[::1]:8080/v1")
    assert (t["host"], t["port"], t["prefix"], t["host_header"]) == ("::1", 8080, "/v1", "[::1]:8080")


@pytest.mark.parametrize("bad", ["ftp://x", "127.0.0.1:30000", "http://", "http://h:99999",
                                 "http://h:port", "http://a b/", "", "http://[::1"])
def test_parse_base_url_refuses(bad):
    with pytest.raises(h.BadURL, match="url must be http") as info:
        h.parse_base_url(bad)
    assert isinstance(info.value, ValueError) and repr(bad) in str(info.value)


def test_parse_base_url_error_hides_credentials():
    with pytest.raises(ValueError) as info:
        h.parse_base_url("ftp://user:s3cret@host:21/x")
    assert "s3cret" not in str(info.value) and "ftp://host:21/x" in str(info.value)
    with pytest.raises(h.BadURL, match="must be a string"):
        h.parse_base_url(None)


# ---- request_bytes -------------------------------------------------------------------------

T = {"scheme": "http", "host": "127.0.0.1", "port": 30000, "prefix": "/prefix",
     "host_header": "127.0.0.1:30000"}


def test_request_bytes_post():
    req = h.request_bytes(T, "POST", "/generate", b"{}", api_key="sekret", keep_alive=True,
                          user_agent="ua/1")
    assert req == (b"POST /prefix/generate HTTP/1.1\r\nHost: 127.0.0.1:30000\r\n"
                   b"User-Agent: ua/1\r\nAccept: */*\r\nConnection: keep-alive\r\n"
                   b"Authorization: Bearer sekret\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 2\r\n\r\n{}")


def test_request_bytes_get_and_header_override():
    req = h.request_bytes(T, "GET", "/health")
    assert req.startswith(b"GET /prefix/health HTTP/1.1\r\n") and req.endswith(b"\r\n\r\n")
    assert b"Connection: close\r\n" in req
    assert b"Content-Length" not in req and b"Content-Type" not in req and b"Authorization" not in req
    req = h.request_bytes(T, "POST", "/x", None, headers={"accept": "text/event-stream",
                                                        "Content-Length": "99"})
    assert b"accept: text/event-stream\r\n" in req and b"Accept: */*" not in req
    assert req.endswith(b"Content-Length: 0\r\n\r\n") and b"99" not in req


@pytest.mark.parametrize("kwargs", [
    {"path": "/x\r\nX-Evil: 1"}, {"path": "/a b"}, {"path": "noslash"}, {"path": "/caf\u00e9"},
    {"headers": {"X-A": "ok\r\nX-Evil: 1"}}, {"headers": {"Bad Name": "v"}},
    {"api_key": "key\nX-Evil: 1"}, {"method": "GE T"}, {"headers": {"X-U": "\u20ac"}},
])
def test_request_bytes_refuses_what_breaks_the_message(kwargs):
    args = {"method": "GET", "path": "/x", **kwargs}
    with pytest.raises(ValueError):
        h.request_bytes(T, args.pop("method"), args.pop("path"), **args)


# ---- parse_head ----------------------------------------------------------------------------

def test_parse_head():
    status, headers = h.parse_head(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Multi: a\r\n"
        b"x-multi: b\r\nX-Folded: one\r\n  two\r\nEmpty:\r\n\r\n")
    assert status == 200
    assert headers == {"content-type": "text/event-stream", "x-multi": "a, b",
                       "x-folded": "one two", "empty": ""}
    assert h.parse_head(b"HTTP/1.0 404\r\n") == (404, {})
    assert h.parse_head(b"HTTP/1.1 503 Service Unavailable\n\n") == (503, {})


@pytest.mark.parametrize("head, what", [
    (b"", "status line"), (b"garbage\r\n\r\n", "status line"),
    (b"HTTP/1.1 abc OK\r\n\r\n", "status line"), (b"HTTP/1.1 20 OK\r\n\r\n", "status line"),
    (b"ICY 200 OK\r\n\r\n", "status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header line"),
    (b"HTTP/1.1 200 OK\r\nBad Name: v\r\n\r\n", "header line"),
])
def test_parse_head_errors(head, what):
    with pytest.raises(h.ProtocolError, match="malformed.*" + what):
        h.parse_head(head)


def test_head_end():
    assert h.head_end(b"HTTP/1.1 200 OK\r\n\r\nbody") == 19
    assert h.head_end(b"HTTP/1.1 200 OK\r\n") == -1
    with pytest.raises(h.ProtocolError, match="longer than"):
        h.head_end(b"x" * (h.MAX_HEAD_BYTES + 1))


# ---- BodyDecoder ---------------------------------------------------------------------------

CHUNKED = {"transfer-encoding": "chunked"}
# Chunk extensions (one quoted, with a ';' inside), data holding CRLF, upper-case hex,
# a trailer section, then the start of a next message that is not this body's.
WIRE = (b"5\r\nhello\r\n"
        b"6;ext=1;q=\"a;b\"\r\n wor\r\n\r\n"
        b"A \t; name\r\n0123456789\r\n"
        b"0;last\r\nX-Checksum: abc\r\nX-Count: 3\r\n\r\n")
BODY = b"hello wor\r\n0123456789"


def _feed_all(dec, pieces):
    return b"".join(dec.feed(p) for p in pieces)


def test_chunked_split_at_every_byte_boundary():
    for k in range(len(WIRE) + 1):
        dec = h.BodyDecoder(CHUNKED)
        out = dec.feed(WIRE[:k])
        assert not dec.done or k == len(WIRE)
        out += dec.feed(WIRE[k:] + b"NEXT")
        assert (out, dec.done, dec.unused) == (BODY, True, b"NEXT"), k
        assert dec.trailers == {"x-checksum": "abc", "x-count": "3"}
        assert dec.received == len(BODY)


def test_chunked_byte_by_byte_is_done_only_at_the_last_byte():
    dec = h.BodyDecoder(CHUNKED)
    seen = []
    for i in range(len(WIRE)):
        seen.append(dec.feed(WIRE[i:i + 1]))
        assert dec.done == (i == len(WIRE) - 1), i
    assert b"".join(seen) == BODY and dec.feed(b"more") == b"" and dec.unused == b"more"


def test_chunked_without_trailers_and_transfer_encoding_wins_over_length():
    dec = h.BodyDecoder({"transfer-encoding": "gzip, Chunked", "content-length": "3"})
    assert dec.mode == "chunked"
    assert _feed_all(dec, [b"3\r\nabc\r\n", b"0\r\n", b"\r\n"]) == b"abc" and dec.done
    assert dec.trailers == {}


@pytest.mark.parametrize("wire", [
    b"zz\r\n", b"-1\r\n", b"1_0\r\n", b"0x10\r\n", b"\r\n", b" \r\n", b";ext\r\n",
    b"11111111111111111\r\n",                     # 17 hex digits
    b"5\r\nhelloXX",                              # chunk data not ended by CRLF
    b"0\r\nno colon\r\n\r\n",                     # malformed trailer
])
def test_chunked_malformed_raises(wire):
    dec = h.BodyDecoder(CHUNKED)
    with pytest.raises(h.ProtocolError) as info:
        for i in range(len(wire)):
            dec.feed(wire[i:i + 1])
    msg = str(info.value)
    assert isinstance(info.value, ValueError) and ("chunk" in msg or "trailer line" in msg)


def test_chunked_size_line_without_end_is_refused():
    dec = h.BodyDecoder(CHUNKED)
    dec.feed(b"5" * 100)                          # a long line may still come to an end
    with pytest.raises(h.ProtocolError, match="longer than"):
        dec.feed(b"5" * h.MAX_LINE_BYTES)


def test_chunked_cut_by_eof():
    dec = h.BodyDecoder(CHUNKED)
    assert dec.feed(b"5\r\nhel") == b"hel"
    with pytest.raises(h.IncompleteBody, match="middle of the response body.*3 bytes"):
        dec.eof()


def test_content_length():
    dec = h.BodyDecoder({"content-length": "11"})
    assert dec.mode == "length"
    assert _feed_all(dec, [b"hello", b" ", b"world", b"EXTRA"]) == b"hello world"
    assert dec.done and dec.unused == b"EXTRA"
    dec = h.BodyDecoder({"content-length": "11"})
    assert dec.feed(b"hello") == b"hello" and not dec.done
    with pytest.raises(h.IncompleteBody, match="5 of 11 bytes"):
        dec.eof()
    assert h.BodyDecoder({"content-length": "0"}).done
    assert h.BodyDecoder({"content-length": "4, 4"}).feed(b"abcdef") == b"abcd"


@pytest.mark.parametrize("value", ["-1", "abc", "4, 5", "", "1e3"])
def test_content_length_malformed(value):
    with pytest.raises(h.ProtocolError, match="Content-Length"):
        h.BodyDecoder({"content-length": value})


def test_until_close():
    for headers in ({}, {"transfer-encoding": "gzip"}):
        dec = h.BodyDecoder(headers)
        assert dec.mode == "close"
        assert _feed_all(dec, [b"a", b"", b"bc\r\n0\r\n\r\n"]) == b"abc\r\n0\r\n\r\n"
        assert not dec.done
        dec.eof()
        assert dec.done and dec.received == 10


def test_no_body():
    for dec in (h.BodyDecoder({"content-length": "5"}, status=204),
                h.BodyDecoder({"content-length": "5"}, status=304),
                h.BodyDecoder({}, status=101),
                h.BodyDecoder(CHUNKED, status=200, head_request=True)):
        assert dec.done and dec.feed(b"x") == b""
        dec.eof()                                 # not an error: there was no body to wait for
    assert not h.BodyDecoder({}, status=200).done


# ---- the synchronous client against loopback servers ---------------------------------------

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    routes: dict = {}
    seen: list = []

    def do_GET(self):  # noqa: N802 (http.server naming)
        self.seen.append((self.path, dict(self.headers)))
        status, body, chunked = self.routes.get(self.path, (404, b'{"error": "not found"}', False))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 7):
                piece = body[i:i + 7]
                self.wfile.write(b"%x;n=%d\r\n%s\r\n" % (len(piece), i, piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\nX-Done: yes\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    Handler.routes, Handler.seen = {}, []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = "http://127.0.0.1:%d" % srv.server_port
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture()
def refused_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "http://127.0.0.1:%d" % port


@pytest.fixture()
def silent_url():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    s = socket.create_server(("127.0.0.1", 0))
    yield "http://127.0.0.1:%d" % s.getsockname()[1]
    s.close()


def _raw_server(response):
    """A one-shot server that reads the request head, writes ``response`` and closes
    (response None: resets the connection instead)."""
    s = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = s.accept()
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(4096)
            if response is None:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                conn.sendall(response)
        s.close()
    threading.Thread(target=serve, daemon=True).start()
    return "http://127.0.0.1:%d" % s.getsockname()[1]


def test_get_json_200_and_request(server):
    Handler.routes["/p/server_info"] = (200, b'{"version": "0.5.23", "n": [1, 2]}', False)
    status, data = h.get_json(server.url + "/p/", "/server_info", api_key="k3y", timeout=5)
    assert (status, data) == (200, {"version": "0.5.23", "n": [1, 2]})
    path, headers = Handler.seen[-1]
    assert path == "/p/server_info"
    assert headers["Authorization"] == "Bearer k3y" and headers["Accept"] == "application/json"
    assert headers["Host"] == "127.0.0.1:%d" % server.server_port


def test_get_json_chunked_and_text(server):
    big = json.dumps({"items": list(range(300))}).encode()
    Handler.routes["/big"] = (200, big, True)
    Handler.routes["/text"] = (500, b"upstream exploded", False)
    assert h.get_json(server.url, "/big") == (200, {"items": list(range(300))})
    assert h.get_json(server.url, "/text") == (500, "upstream exploded")
    with pytest.raises(h.ProtocolError, match="larger than 100 bytes"):
        h.get_json(server.url, "/big", limit=100)


def test_get_json_404_is_an_answer(server):
    assert h.get_json(server.url, "/nothing") == (404, {"error": "not found"})


def test_get_json_refused(refused_url):
    with pytest.raises(h.Unreachable, match="connection refused by 127.0.0.1:") as info:
        h.get_json(refused_url, "/server_info", timeout=2)
    assert info.value.kind == "refused"


def test_get_json_timeout(silent_url):
    t0 = time.monotonic()
    with pytest.raises(h.HttpTimeout):
        h.get_json(silent_url, "/server_info", timeout=0.3)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize("response, error, match", [
    (b"", h.ConnectionClosed, "before the response headers"),
    (None, h.ConnectionClosed, "GET /x to 127.0.0.1:[0-9]+ failed: .*reset"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", h.ProtocolError, "malformed HTTP status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"a\":", h.IncompleteBody, "5 of 50"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nq\r\n", h.ProtocolError,
     "malformed chunk size"),
])
def test_get_json_bad_answers(response, error, match):
    with pytest.raises(error, match=match):
        h.get_json(_raw_server(response), "/x", timeout=5)


def test_get_json_until_close():
    url = _raw_server(b"HTTP/1.0 200 OK\r\n\r\n[1, 2, 3]")
    assert h.get_json(url, "/x", timeout=5) == (200, [1, 2, 3])


def test_stream_reads_body_pieces_and_trailers(server):
    Handler.routes["/s"] = (200, b"0123456789abcdefghij", True)
    st = h.Stream(server.url)
    try:
        st.connect(5)
        st.send("GET", "/s")
        st.read_head(time.monotonic() + 5)
        assert st.status == 200 and st.headers["transfer-encoding"] == "chunked"
        out = b""
        while True:
            piece = st.read_body(time.monotonic() + 5)
            if not piece:
                break
            out += piece
    finally:
        st.close()
    assert out == b"0123456789abcdefghij" and st.decoder.trailers == {"x-done": "yes"}


# ---- the users: sglang_health and the probe's /server_info ---------------------------------

def _health_module():
    spec = importlib.util.spec_from_file_location("ddtree_library_sglang_health_http",
                                                  LIBRARY / "sglang_health.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_health_status(server, refused_url, silent_url, monkeypatch):
    health = _health_module()
    Handler.routes["/health"] = (200, b"", False)
    assert health.health_status(server.url) == 200
    assert health.health_status(server.url + "/") == 200
    Handler.routes["/health"] = (503, b'{"status": "starting"}', False)
    assert health.health_status(server.url) == 503
    assert health.health_status(refused_url) == 0
    monkeypatch.setattr(health, "HEALTH_TIMEOUT", 0.3)
    t0 = time.monotonic()
    assert health.health_status(silent_url) == 0
    assert time.monotonic() - t0 < 2
    with pytest.raises(ValueError, match="url must be http"):
        health.health_status("127.0.0.1:30000")


def test_fetch_server_info_falls_back_on_404(server):
    Handler.routes["/get_server_info"] = (200, json.dumps({
        "version": "0.5.9", "api_key": "SERVER-SECRET",
        "internal_states": [{"avg_spec_accept_length": 2.5, "other": 1}]}).encode(), False)
    info = dp.fetch_server_info(server.url)
    assert info == {"source": "/get_server_info", "version": "0.5.9",
                    "internal_states": [{"avg_spec_accept_length": 2.5}],
                    "avg_spec_accept_length": 2.5}
    assert [p for p, _ in Handler.seen] == ["/server_info", "/get_server_info"]
    assert Handler.seen[0][1]["User-Agent"] == "ddtree-probe/1"


def test_fetch_server_info_errors(server, refused_url):
    Handler.routes["/server_info"] = (500, b"boom", False)
    assert dp.fetch_server_info(server.url) == {"error": "HTTP 500 from /server_info"}
    assert [p for p, _ in Handler.seen] == ["/server_info"]          # no fallback after a 500
    assert dp.fetch_server_info(server.url + "/none") == {"error": "HTTP 404 from /get_server_info"}
    Handler.routes["/server_info"] = (200, b"[1]", False)
    assert dp.fetch_server_info(server.url) == {"error": "/server_info: not a JSON object"}
    err = dp.fetch_server_info(refused_url)["error"]
    assert err.startswith("/server_info: connection refused by 127.0.0.1:")


def test_probe_bad_url_is_probe_error():
    with pytest.raises(dp.ProbeError, match="url must be http"):
        dp.run_probe("127.0.0.1:30000")
    with pytest.raises(dp.ProbeError, match="url must be http"):
        dp.run_probe("http://h:99999")


# ---- AnsiballZ ships ddtree_http with the modules that need it -----------------------------

def test_ansiballz_ships_ddtree_http(server, refused_url, tmp_path):
    """Each module imports ddtree_http (directly or through its module_utils); without it in
    the AnsiballZ payload the import fails and the module cannot start."""
    Handler.routes["/health"] = (200, b"", False)
    rc, status, result, raw = run_adhoc(tmp_path, "sglang_health",
                                        "url=%s unit='' timeout=5" % server.url, check=False)
    assert rc == 0 and status == "SUCCESS", raw
    assert result["healthy"] is True and result["last_status"] == 200
    rc, status, result, raw = run_adhoc(tmp_path, "sglang_probe", "url=%s" % refused_url,
                                        check=False)
    assert rc == 0 and status == "SUCCESS", raw
    assert result["verdict"] == "inconclusive" and "refused" in result["reasons"][0]
    args = json.dumps({"url": refused_url, "concurrency": [1], "requests_per_level": 1,
                       "warmup": 0, "timeout": 5, "workload": {
                           "version": "t", "requests": [{"prompt": "p", "max_new_tokens": 1}]}})
    rc, status, result, raw = run_adhoc(tmp_path, "sglang_bench", args, check=False)
    assert rc == 0 and status == "SUCCESS", raw
    assert result["status"] == "failed" and "ConnectionRefusedError" in raw


def test_health_module_refuses_a_bad_url(tmp_path):
    rc, status, result, raw = run_adhoc(tmp_path, "sglang_health", "url=localhost:30000 unit=''",
                                        check=False)
    assert rc != 0 and status == "FAILED!", raw
    assert "url must be http" in result["msg"] and "localhost:30000" in result["msg"]
