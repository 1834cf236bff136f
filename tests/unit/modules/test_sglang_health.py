"""sglang_health: waits for /health 200 and fails early when the systemd unit crashes."""
from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


class Health(http.server.BaseHTTPRequestHandler):
    statuses: list = []

    def do_GET(self):  # noqa: N802 (http.server naming)
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def fake_systemctl(tmp_path, states):
    """A systemctl that answers `show` with successive states (the last one repeats)."""
    (tmp_path / "states.json").write_text(json.dumps(states))
    script = tmp_path / "bin" / "systemctl"
    script.parent.mkdir()
    script.write_text(f"""#!{sys.executable}
import json, sys
p = {str(tmp_path / 'states.json')!r}
states = json.load(open(p))
cur = states.pop(0) if len(states) > 1 else states[0]
json.dump(states, open(p, "w"))
print("\\n".join(f"{{k}}={{v}}" for k, v in cur.items()))
""")
    script.chmod(0o755)
    return script.parent


def run_module(tmp_path, args, path_dir):
    (tmp_path / "args.json").write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = {"PATH": f"{path_dir}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "collections")}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, str(REPO / "plugins" / "modules" / "sglang_health.py"), str(tmp_path / "args.json")],
                         capture_output=True, text=True, env=env, timeout=60)
    return json.loads(res.stdout), time.monotonic() - t0


RUNNING = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "ExecMainStatus": "0", "Result": "success"}


def test_healthy_after_warmup(tmp_path, server):
    Health.statuses = [503, 503, 200]
    out, _ = run_module(tmp_path, {"url": f"http://127.0.0.1:{server.server_port}", "interval": 0.1,
                                   "skip_in_check_mode": False}, fake_systemctl(tmp_path, [RUNNING]))
    assert out["healthy"] is True and out["state"] == "healthy" and out["last_status"] == 200
    assert not out.get("failed")


def test_crash_loop_is_reported_within_a_poll(tmp_path, server):
    Health.statuses = [503]
    crashed = dict(RUNNING, ActiveState="activating", SubState="auto-restart", ExecMainStatus="1")
    out, took = run_module(tmp_path, {"url": "http://127.0.0.1:9", "interval": 0.2, "timeout": 30},
                           fake_systemctl(tmp_path, [RUNNING, RUNNING, crashed]))
    assert out["failed"] and out["state"] == "crashed"
    assert "crashed" in out["msg"] and took < 10  # not the 30 s timeout


def test_failed_unit_is_reported(tmp_path, server):
    out, took = run_module(tmp_path, {"url": "http://127.0.0.1:9", "interval": 0.2, "timeout": 30},
                           fake_systemctl(tmp_path, [dict(RUNNING, ActiveState="failed", SubState="failed")]))
    assert out["failed"] and out["state"] == "failed" and took < 10


def test_timeout_names_the_url(tmp_path, server):
    Health.statuses = [503]
    url = f"http://127.0.0.1:{server.server_port}"
    out, _ = run_module(tmp_path, {"url": url, "interval": 0.2, "timeout": 1}, fake_systemctl(tmp_path, [RUNNING]))
    assert out["failed"] and out["state"] == "timeout" and url in out["msg"] and out["last_status"] == 503


def test_check_mode_returns_at_once(tmp_path):
    (tmp_path / "bin").mkdir()
    args = {"url": "http://127.0.0.1:9", "_ansible_check_mode": True}
    out, took = run_module(tmp_path, args, tmp_path / "bin")
    assert out["changed"] is False and out["state"] == "check_mode" and took < 10
