#!/usr/bin/env python3
"""The lab mirror: a static HTTP server for the PyPI simple index and the model mirror.

Serves files under --root with byte ranges (so downloads can resume, as from a real mirror) and
logs one line per request. Lab-only; an air-gapped site would run a real mirror (devpi, nginx).

Fault switches for the weights tests: --faults names a JSON file (re-read on every request; absent
means no faults) mapping a URL path to a fault:

  {"/models/z-lab/Qwen3.6-27B-DFlash/<rev>/model.safetensors": {"mode": "cut", "times": 1}}

  cut      send the headers with the full Content-Length, then half the body, then close
  corrupt  send the full length with altered bytes (the sha256 in the manifest no longer matches)

"times" is how many responses get the fault (-1 or absent: every one); it is counted per version
of the faults file, so rewriting the file re-arms it. "client" (optional) limits the fault to
requests from one address, so tests that run side by side (one lab slot each) fault only their
own host's downloads. Besides --faults, every *.json file in --faults-dir is a table of the same
form (one file per test worker: no two writers share a file).
"""
import argparse
import functools
import glob
import http.server
import json
import os
import re
import threading


class Faults:
    """The fault tables (--faults, --faults-dir/*.json) and how many times each fault has fired
    for its table's current version."""

    def __init__(self, path, directory=None):
        self.path = path
        self.directory = directory
        self.lock = threading.Lock()
        self.fired = {}

    def tables(self):
        paths = [self.path] if self.path else []
        if self.directory:
            paths += sorted(glob.glob(os.path.join(self.directory, "*.json")))
        for path in paths:
            try:
                version = os.stat(path).st_mtime_ns
                with open(path) as fh:
                    table = json.load(fh)
            except (OSError, ValueError):
                continue
            if isinstance(table, dict):
                yield path, version, table

    def take(self, url_path, client=None):
        """The fault mode to apply to this response (to a request from client), or None."""
        for path, version, table in self.tables():
            fault = table.get(url_path)
            if not isinstance(fault, dict) or fault.get("mode") not in ("cut", "corrupt"):
                continue
            if fault.get("client") not in (None, client):
                continue
            times = int(fault.get("times", -1))
            with self.lock:
                key = (path, version, url_path)
                if 0 <= times <= self.fired.get(key, 0):
                    continue
                self.fired[key] = self.fired.get(key, 0) + 1
            return fault["mode"]
        return None


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def __init__(self, *args, faults=None, **kwargs):
        self.faults = faults
        super().__init__(*args, **kwargs)

    def do_GET(self):
        path = self.translate_path(self.path)
        mode = (self.faults.take(self.path.split("?", 1)[0], self.client_address[0])
                if self.faults and os.path.isfile(path) else None)
        if mode is None:
            return super().do_GET()
        with open(path, "rb") as fh:
            body = fh.read()
        self.log_message("lab fault %s on %s", mode, self.path)
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "cut":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return None
        altered = bytearray(body)
        for i in range(0, len(altered), max(1, len(altered) // 16)):
            altered[i] ^= 0xFF
        self.wfile.write(bytes(altered))
        return None

    def send_head(self):
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not rng or os.path.isdir(path) or not os.path.isfile(path):
            return super().send_head()
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
        size = os.path.getsize(path)
        if not m or int(m.group(1)) >= size:
            self.send_error(416, "Requested Range Not Satisfiable")
            return None
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        fh = open(path, "rb")
        fh.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._remaining = end - start + 1
        return fh

    def copyfile(self, source, outputfile):
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        while remaining > 0:
            chunk = source.read(min(65536, remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            remaining -= len(chunk)
        self._remaining = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--tag", default="ddtree-lab-mirror", help="marker in the command line (for PID checks)")
    ap.add_argument("--faults", default=os.path.join(os.environ.get("DDTREE_LAB_STATE", "/var/lib/ddtree-lab"),
                                                     "mirror-faults.json"),
                    help="JSON fault table for tests (see the module docstring)")
    ap.add_argument("--faults-dir", default=os.path.join(os.environ.get("DDTREE_LAB_STATE", "/var/lib/ddtree-lab"),
                                                         "mirror-faults.d"),
                    help="directory of further fault tables, one *.json per writer")
    args = ap.parse_args()
    handler = functools.partial(Handler, directory=args.root, faults=Faults(args.faults, args.faults_dir))
    http.server.ThreadingHTTPServer.allow_reuse_address = True
    with http.server.ThreadingHTTPServer((args.bind, args.port), handler) as srv:
        srv.serve_forever()


if __name__ == "__main__":
    main()
