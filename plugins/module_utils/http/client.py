# -*- coding: utf-8 -*-
"""HTTP/1.1 on the wire for the probe, the benchmark and the health wait (stdlib only).

Sans-IO pieces, shared with the asyncio client of ``bench/runner``: ``parse_base_url``,
``request_bytes``, ``parse_head`` and ``BodyDecoder`` (RFC 9112 section 6.3 framing).
``Stream`` sends one request over a raw socket and reads the response with hard deadlines;
``get_json`` is one small request with an overall timeout.  Every error raised here is an
``HttpError``; ``BadURL`` and ``ProtocolError`` (bad input or bad bytes) are ``ValueError`` too.

Imported by the modules (AnsiballZ ships it with them) and by the controller CLIs and the tests,
always as ``ansible_collections.ddtree.fleet.plugins.module_utils.http.client``: no ansible imports.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import ssl
import time
import urllib.parse

USER_AGENT = "ddtree-fleet/1"
DEFAULT_TIMEOUT = 5.0
MAX_HEAD_BYTES = 65536          # a response head (status line + fields) longer than this is refused
MAX_LINE_BYTES = 8192           # the same for one chunk-size or trailer line
MAX_JSON_BYTES = 2_000_000      # get_json: the largest body it accepts
RECV_BYTES = 65536

_STATUS_RE = re.compile(r"HTTP/(\d)\.(\d) ([0-9]{3})(?: .*)?\Z")
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_HEX_RE = re.compile(rb"[0-9A-Fa-f]{1,16}\Z")
_DIGITS_RE = re.compile(r"[0-9]{1,18}\Z")
_UNSAFE_RE = re.compile(r"[\x00-\x20\x7f]")       # not in a host name
_TARGET_RE = re.compile(r"/[\x21-\x7e]*\Z")      # a request target: visible ASCII from a /
_CRLF_RE = re.compile(r"[\r\n\x00]")              # not in a header field value


class HttpError(Exception):
    """Base of every error raised here."""


class BadURL(HttpError, ValueError):
    """A base URL that is not http(s)://host[:port][/prefix]."""


class ProtocolError(HttpError, ValueError):
    """The peer's bytes are not HTTP/1.1: a malformed status line, header field or chunk size."""


class IncompleteBody(ProtocolError):
    """The connection ended before the end of the body its framing announced."""


class Unreachable(HttpError):
    """No connection.  ``kind``: dns, refused, connect_timeout or connect_error."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind


class ConnectionClosed(HttpError):
    """The connection ended (or failed) before the response head."""


class HttpTimeout(HttpError):
    """A deadline passed while waiting for the response."""


# --------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------

def _netloc(host: str, port: int | None) -> str:
    """host[:port], an IPv6 address in brackets."""
    netloc = "[%s]" % host if ":" in host else host
    return netloc + ":%d" % port if port else netloc


def redact_url(url: str) -> str:
    """Drop user:password@ from a URL."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except (TypeError, ValueError, AttributeError):
        return url
    if parts.username is None and parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=_netloc(host, port)))


def parse_base_url(url: str) -> dict:
    """Where a server is: ``{scheme, host, port, prefix, host_header}``.

    ``url`` is http(s)://host[:port][/prefix]; ``prefix`` (no trailing slash) is put before
    every request path.  Raises BadURL (a ValueError) naming the URL, credentials removed.
    """
    if not isinstance(url, str):
        raise BadURL("url must be a string http(s)://host[:port][/prefix], got %r"
                     % type(url).__name__)
    why = ""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        host, port = parts.hostname, parts.port      # .port: ValueError when out of range
    except ValueError as exc:
        parts, host, port, why = None, None, None, " (%s)" % exc
    if parts is None or parts.scheme not in ("http", "https") or not host \
            or _UNSAFE_RE.search(host):
        raise BadURL("url must be http(s)://host[:port][/prefix], got %r%s"
                     % (redact_url(url), why))
    return {"scheme": parts.scheme, "host": host,
            "port": port or (443 if parts.scheme == "https" else 80),
            "prefix": parts.path.rstrip("/"), "host_header": _netloc(host, port)}


# --------------------------------------------------------------------------
# messages (sans-IO)
# --------------------------------------------------------------------------

def request_bytes(target: dict, method: str, path: str, body: bytes | None = None, *,
                  headers: dict | None = None, api_key: str | None = None,
                  keep_alive: bool = False, user_agent: str = USER_AGENT) -> bytes:
    """One HTTP/1.1 request message for ``target`` (a ``parse_base_url`` dict).

    Host, User-Agent, Accept (``*/*``) and Connection (close, or keep-alive) are always sent;
    ``api_key`` adds ``Authorization: Bearer``; ``headers`` add fields or replace those
    (case-insensitively).  A request with a body (or any POST/PUT/PATCH) gets Content-Type
    ``application/json`` unless ``headers`` name another, and always a Content-Length, last.
    Raises ValueError for a field or path that would break the message (CR, LF, spaces).
    """
    if not _TOKEN_RE.match(method or ""):
        raise ValueError("bad HTTP method %r" % method)
    target_path = target["prefix"] + path
    if not path.startswith("/") or not _TARGET_RE.match(target_path):
        raise ValueError("bad request path %r (it must start with / and hold only visible "
                         "ASCII: percent-encode the rest)" % target_path)
    if body is None and method in ("POST", "PUT", "PATCH"):
        body = b""
    fields = {"host": ("Host", target["host_header"]),
              "user-agent": ("User-Agent", user_agent),
              "accept": ("Accept", "*/*"),
              "connection": ("Connection", "keep-alive" if keep_alive else "close")}
    if api_key:
        fields["authorization"] = ("Authorization", "Bearer " + api_key)
    if body is not None:
        fields["content-type"] = ("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        fields[name.lower()] = (name, str(value))
    fields.pop("content-length", None)
    if body is not None:
        fields["content-length"] = ("Content-Length", str(len(body)))
    lines = ["%s %s HTTP/1.1" % (method, target_path)]
    for name, value in fields.values():
        if not _TOKEN_RE.match(name) or _CRLF_RE.search(value):
            raise ValueError("bad HTTP header field %r (a name must be a token; a value holds "
                             "no CR, LF or NUL)" % name)
        lines.append("%s: %s" % (name, value))
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise ValueError("HTTP request head is not latin-1: %s" % exc) from None
    return head + (body or b"")


def head_end(buf: bytes) -> int:
    """Length of the response head at the start of ``buf`` (through the blank line), or -1.

    Raises ProtocolError when ``buf`` holds MAX_HEAD_BYTES without the end of a head.
    """
    i = buf.find(b"\r\n\r\n")
    if i >= 0:
        return i + 4
    if len(buf) > MAX_HEAD_BYTES:
        raise ProtocolError("response head longer than %d bytes" % MAX_HEAD_BYTES)
    return -1


def _fields(lines, what: str, into: dict) -> dict:
    """Header (or trailer) field lines into ``into``: lower-case names, repeats joined by ", "."""
    last = None
    for line in lines:
        if line[:1] in (" ", "\t") and last is not None:      # obsolete line folding
            into[last] = (into[last] + " " + line.strip()).strip()
            continue
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN_RE.match(name):
            raise ProtocolError("malformed %s line %r" % (what, line[:80]))
        last = name.lower()
        value = value.strip()
        into[last] = into[last] + ", " + value if last in into else value
    return into


def parse_head(head: bytes) -> tuple:
    """(status, headers) of a response head: the status line and the header fields.

    Header names are lower-cased; a repeated field's values are joined by ", ".  The head may
    end with the blank line or not.  Raises ProtocolError on a malformed status or field line.
    """
    text = head.decode("latin-1")
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    status_line = lines[0] if lines else ""
    m = _STATUS_RE.match(status_line)
    if m is None:
        raise ProtocolError("malformed HTTP status line %r" % status_line[:80])
    return int(m.group(3)), _fields(lines[1:], "header", {})


class BodyDecoder:
    """Incremental decoder of one response body, framed as RFC 9112 section 6.3 says.

    ``feed(data)`` takes received bytes in any pieces and returns the body bytes they complete;
    ``done`` turns True at the end of the body (bytes after it stay in ``unused``, trailer
    fields land in ``trailers``).  ``eof()`` says the peer closed the connection: it ends a
    read-until-close body and raises IncompleteBody when the framing announced more.  Bad
    framing (chunk size, chunk end, trailer, Content-Length) raises ProtocolError.
    """

    def __init__(self, headers: dict, status: int | None = None, head_request: bool = False):
        self.done = False
        self.received = 0          # body bytes returned so far
        self.trailers = {}
        self.unused = b""
        self._buf = bytearray()
        self._left = 0             # bytes left: of the body (length) or of this chunk (chunked)
        self._state = "size"       # chunked: size, data, data_end, trailer
        codings = [c.strip().lower() for c in headers.get("transfer-encoding", "").split(",")
                   if c.strip()]
        # No body after HEAD or a 1xx/204/304; chunked when it is the last transfer coding,
        # read until close for another one; else Content-Length, else read until close.
        if head_request or (status is not None and (100 <= status < 200 or status in (204, 304))):
            self.mode = "length"
            self.done = True
        elif codings:
            self.mode = "chunked" if codings[-1] == "chunked" else "close"
        elif "content-length" in headers:
            # one number (a repeated field must repeat the same number)
            values = {v.strip() for v in headers["content-length"].split(",")}
            if len(values) != 1 or not _DIGITS_RE.match(next(iter(values))):
                raise ProtocolError("malformed Content-Length %r" % headers["content-length"][:40])
            self.mode = "length"
            self._left = int(values.pop())
            self.done = self._left == 0
        else:
            self.mode = "close"

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.unused += data
            return b""
        if self.mode == "close":
            out = bytes(data)
        elif self.mode == "length":
            out = bytes(data[:self._left])
            self._left -= len(out)
            if self._left == 0:
                self.done = True
                self.unused += data[len(out):]
        else:
            self._buf += data
            out = self._dechunk()
        self.received += len(out)
        return out

    def _line(self, pos: int):
        """(the CRLF-ended line at pos, the position after it), or (None, pos) if incomplete."""
        eol = self._buf.find(b"\r\n", pos)
        if eol < 0:
            if len(self._buf) - pos > MAX_LINE_BYTES:
                raise ProtocolError("chunk-size or trailer line longer than %d bytes"
                                    % MAX_LINE_BYTES)
            return None, pos
        return bytes(self._buf[pos:eol]), eol + 2

    def _dechunk(self) -> bytes:
        buf, out, pos = self._buf, bytearray(), 0
        while not self.done:
            if self._state == "data":
                take = min(self._left, len(buf) - pos)
                out += buf[pos:pos + take]
                pos += take
                self._left -= take
                if self._left:
                    break
                self._state = "data_end"
            elif self._state == "data_end":
                if len(buf) - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF (got %r)"
                                        % bytes(buf[pos:pos + 2]))
                pos += 2
                self._state = "size"
            else:
                line, pos = self._line(pos)
                if line is None:
                    break
                if self._state == "size":
                    size = line.split(b";", 1)[0].strip(b" \t")
                    if not _HEX_RE.match(size):
                        raise ProtocolError("malformed chunk size line %r" % line[:40])
                    self._left = int(size, 16)
                    self._state = "data" if self._left else "trailer"
                elif line:
                    _fields([line.decode("latin-1")], "trailer", self.trailers)
                else:
                    self.done = True
        if self.done:
            self.unused += bytes(buf[pos:])
            buf.clear()
        else:
            del buf[:pos]
        return bytes(out)

    def eof(self) -> None:
        """The peer closed the connection."""
        if self.done or self.mode == "close":
            self.done = True
            return
        if self.mode == "length":
            raise IncompleteBody("connection closed in the middle of the response body "
                                 "(%d of %d bytes)" % (self.received, self.received + self._left))
        raise IncompleteBody("connection closed in the middle of the response body (chunked, "
                             "%d bytes decoded)" % self.received)


# --------------------------------------------------------------------------
# the synchronous client: a raw socket with hard deadlines
# --------------------------------------------------------------------------

class Stream:
    """One HTTP request whose response is read incrementally with hard deadlines.

    ``connect(timeout)``, ``send(...)``, ``read_head(deadline)`` (sets ``status`` and
    ``headers``), then ``read_body(deadline)`` until it returns b''; ``close()`` at the end.
    Deadlines are times of ``time.monotonic()``.  A raw socket is used (not http.client) because a
    timed-out read on http.client's buffered file object leaves it unusable, and the probe
    needs to wake up on deadlines without losing the stream.  Raises Unreachable (connect),
    HttpTimeout (a deadline), ConnectionClosed (no head), ProtocolError / IncompleteBody (bad
    or cut bytes); a failed send or read raises its OSError.
    """

    def __init__(self, url, user_agent: str = USER_AGENT):
        self.target = url if isinstance(url, dict) else parse_base_url(url)
        self.user_agent = user_agent
        self.sock = None
        self.status = None
        self.headers = {}
        self.decoder = None
        self._raw = b""            # received bytes not yet parsed
        self._head_request = False

    def connect(self, timeout: float):
        host, port = self.target["host"], self.target["port"]
        try:
            sock = socket.create_connection((host, port), timeout=max(0.05, timeout))
        except socket.gaierror as exc:
            raise Unreachable("dns", "cannot resolve %s: %s" % (host, exc)) from None
        except ConnectionRefusedError:
            raise Unreachable("refused", "connection refused by %s:%d" % (host, port)) from None
        except socket.timeout:
            raise Unreachable("connect_timeout", "connect to %s:%d timed out after %.1f s" % (
                host, port, timeout)) from None
        except OSError as exc:
            raise Unreachable("connect_error", "cannot connect to %s:%d: %s" % (
                host, port, exc.strerror or exc)) from None
        if self.target["scheme"] == "https":
            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock

    def send(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
             api_key: str | None = None):
        self._head_request = method == "HEAD"
        self.sock.sendall(request_bytes(self.target, method, path, body, headers=headers,
                                        api_key=api_key, user_agent=self.user_agent))

    def _recv(self, deadline: float) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HttpTimeout("deadline passed")
        self.sock.settimeout(remaining)
        try:
            return self.sock.recv(RECV_BYTES)
        except socket.timeout:
            raise HttpTimeout("no data within %.1f s" % remaining) from None

    def read_head(self, deadline: float):
        while (end := head_end(self._raw)) < 0:
            data = self._recv(deadline)
            if not data:
                raise ConnectionClosed("connection closed before the response headers")
            self._raw += data
        head, self._raw = self._raw[:end], self._raw[end:]
        self.status, self.headers = parse_head(head)
        self.decoder = BodyDecoder(self.headers, self.status, self._head_request)

    def read_body(self, deadline: float) -> bytes:
        """Next decoded body bytes (b'' at the end of the body)."""
        while True:
            if self._raw:
                data, self._raw = self._raw, b""
                out = self.decoder.feed(data)
                if out:
                    return out
            if self.decoder.done:
                return b""
            data = self._recv(deadline)
            if not data:
                self.decoder.eof()
                return b""
            self._raw = data

    def close(self):
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


def get_json(url: str, path: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT,
             *, user_agent: str = USER_AGENT, limit: int = MAX_JSON_BYTES) -> tuple:
    """(status, parsed JSON or text) of one small GET of ``url`` + ``path``.

    Every status comes back (a 404 is an answer).  ``timeout`` bounds the whole exchange.
    Raises BadURL for a bad ``url``, and an HttpError when there is no whole answer:
    Unreachable (refused, DNS, connect timeout), HttpTimeout, ConnectionClosed (the connection
    failed or ended before the head) or ProtocolError (bad bytes, a cut body, more than
    ``limit`` bytes).
    """
    stream = Stream(url, user_agent)
    deadline = time.monotonic() + timeout
    data = bytearray()
    try:
        stream.connect(timeout)
        stream.send("GET", path, headers={"Accept": "application/json"}, api_key=api_key)
        stream.read_head(deadline)
        while True:
            piece = stream.read_body(deadline)
            if not piece:
                break
            data += piece
            if len(data) > limit:
                raise ProtocolError("response from %s is larger than %d bytes" % (path, limit))
    except OSError as exc:
        raise ConnectionClosed("GET %s to %s:%d failed: %s" % (
            path, stream.target["host"], stream.target["port"],
            getattr(exc, "strerror", None) or exc)) from None
    finally:
        stream.close()
    text = data.decode("utf-8", "replace")
    try:
        return stream.status, json.loads(text)
    except ValueError:
        return stream.status, text
