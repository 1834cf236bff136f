"""Tests for plugins/module_utils/state.py and plugins/modules/host_state.py (a host's state read in one call)."""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch
from ansible_collections.ddtree.fleet.plugins.module_utils import state as st
from ddtree_testlib import A6000_LIST, A6000_QUERY

UNIT = "[Service]\nExecStart=/opt/sglang/venvs/x/bin/python -m sglang.launch_server\n"
ENV = "SGLANG_API_KEY=secret\n"
SPEC = "ALGORITHMS = (\n    'EAGLE',\n    'DFLASH',\n)\n"
SPEC_PATCHED = SPEC.replace("    'DFLASH',\n", "    'DFLASH',\n    'DDTREE',\n")


def sha(text, algorithm):
    return hashlib.new(algorithm, text.encode()).hexdigest()


class Host:
    """A host's files under tmp_path: state dir, unit, environment, venv, patches and weights."""

    def __init__(self, root):
        self.root = root
        self.state_dir = root / "state"
        self.unit = root / "etc" / "sglang.service"
        self.env = root / "etc" / "sglang.env"
        self.venv = root / "venv"
        self.site = self.venv / "lib" / "python3.11" / "site-packages"
        self.patch = root / "patches" / "0001-ddtree.patch"
        self.weights = [root / "models" / "target", root / "models" / "draft"]
        self.fingerprint = "fp-declared"
        self.systemd = {"is-active": "active", "is-enabled": "enabled"}
        self.smi = (A6000_QUERY, A6000_LIST)
        self.lock_dir = root / "run" / "lock"
        self.calls = []

    def runner(self, argv, **_kwargs):
        self.calls.append(argv)
        if argv[0] == "systemctl":
            return subprocess.CompletedProcess(argv, 0, self.systemd[argv[1]] + "\n", "")
        if argv[0] == "/usr/bin/nvidia-smi":
            if self.smi is None:
                return subprocess.CompletedProcess(argv, 9, "", "NVIDIA-SMI has failed")
            return subprocess.CompletedProcess(argv, 0, self.smi[0] if argv[1] != "-L" else self.smi[1], "")
        raise AssertionError("unexpected command %r" % argv)

    def params(self, **overrides):
        params = {
            "state_dir": str(self.state_dir),
            "fingerprint": self.fingerprint,
            "service": "sglang.service",
            "unit_path": str(self.unit),
            "unit_sha1": sha(UNIT, "sha1"),
            "env_file": str(self.env),
            "env_sha1": sha(ENV, "sha1"),
            "venv": str(self.venv),
            "python": "/usr/bin/python3",
            "patches": [str(self.patch)],
            "checksums": {self.patch.name: hashlib.sha256(self.patch.read_bytes()).hexdigest()}
            if self.patch.exists() else {},
            "weights": [str(w) for w in self.weights],
            "gpu": True,
            "nvidia_smi": "/usr/bin/nvidia-smi",
            "lock_dir": str(self.lock_dir),
        }
        params.update(overrides)
        return params

    def in_sync(self):
        """A promoted host: live unit and env as declared, venv patched, weights verified, known-good record."""
        self.unit.parent.mkdir(parents=True)
        self.unit.write_text(UNIT)
        self.env.write_text(ENV)
        (self.site / "sglang").mkdir(parents=True)
        (self.site / "sglang" / "spec_info.py").write_text(SPEC_PATCHED)
        (self.venv / ".ddtree-venv.json").write_text("{}")
        self.patch.parent.mkdir(parents=True)
        diff = difflib.unified_diff(SPEC.splitlines(True), SPEC_PATCHED.splitlines(True),
                                    "a/sglang/spec_info.py", "b/sglang/spec_info.py")
        self.patch.write_text("register DDTREE\n\n" + "".join(diff))
        # the stamp sglang_patch writes once the set is applied
        entries = [{"name": self.patch.name, "sha256": hashlib.sha256(self.patch.read_bytes()).hexdigest()}]
        ddtree_patch.write_stamp(str(self.site), ddtree_patch.make_stamp(entries))
        for weights in self.weights:
            weights.mkdir(parents=True)
            (weights / ".ddtree-verified.json").write_text("{}")
        self.promote(self.fingerprint)
        return self

    def promote(self, fingerprint):
        record = self.state_dir / "records" / fingerprint
        record.mkdir(parents=True)
        (record / "unit").write_text(UNIT)
        (record / "env").write_text(ENV)
        gpu = st.gpu_facts_from_outputs(A6000_QUERY, A6000_LIST)
        (record / "meta.json").write_text(json.dumps({
            "fingerprint": fingerprint, "unit_sha256": sha(UNIT, "sha256"), "env_sha256": sha(ENV, "sha256"),
            "gpu": {key: gpu[key] for key in st.GPU_KEYS}}))
        link = self.state_dir / "known-good"
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.join("records", fingerprint))

    def read(self, **overrides):
        return st.read_state(self.params(**overrides), runner=self.runner)


@pytest.fixture
def host(tmp_path):
    return Host(tmp_path)


def test_in_sync_host_has_no_difference(host):
    state = host.in_sync().read()
    assert state["differences"] == []
    assert state["pending_change"] is False
    assert state["known_good"]["fingerprint"] == "fp-declared"
    assert state["known_good"]["problem"] is None
    assert state["known_good"]["records"] == 1
    assert state["quarantine"] == {"path": str(host.state_dir / "quarantine" / "fp-declared.json"),
                                   "exists": False, "record": None}
    assert state["patch"] == {"checked": True, "changed": False, "applied": [], "failed": False, "msg": ""}
    assert state["venv"]["python_version"] == "3.11"
    assert state["in_sync"] is True and state["gpu"]["arch"] == "sm86" and state["gpu_error"] is None
    assert state["lock"] == {"held": False, "owner": None}
    # systemd asked twice and nvidia-smi once (no -L: the UUIDs are not compared), nothing else
    # run (the venv's lib/ names its Python; the patch stamp's digests hold, so no GNU patch)
    assert [c[:2] for c in host.calls] == [["systemctl", "is-active"], ["systemctl", "is-enabled"],
                                          ["/usr/bin/nvidia-smi", st.QUERY_ARGS[0]]]
    assert state["gpu"]["uuids"] == [] and state["gpu"]["count"] == 2


def test_every_kind_of_difference_is_worded_for_the_report(host):
    host.in_sync()
    host.unit.write_text(UNIT + "# hand edit\n")
    host.env.unlink()
    host.systemd.update({"is-active": "inactive", "is-enabled": ""})
    (host.site / "sglang" / "spec_info.py").write_text(SPEC)
    (host.weights[1] / ".ddtree-verified.json").unlink()
    state = host.read(fingerprint="fp-new")
    assert state["differences"] == [
        "unit: %s differs from the declared unit" % host.unit,
        "environment: %s is missing" % host.env,
        "service: sglang.service is inactive",
        "service: sglang.service is not enabled",
        "patch set: would apply 0001-ddtree.patch",
        "weights: %s is missing" % host.weights[1],
        "known-good: record is fp-declared, declared fp-new",
    ]
    assert state["pending_change"] is True
    # the dry run changed nothing
    assert (host.site / "sglang" / "spec_info.py").read_text() == SPEC


def test_fresh_host_lists_what_is_missing_and_checks_no_patch(host):
    host.systemd.update({"is-active": "inactive", "is-enabled": "not-found"})
    state = host.read(patches=[], checksums={})
    assert state["differences"] == [
        "unit: %s is missing" % host.unit,
        "environment: %s is missing" % host.env,
        "service: sglang.service is inactive",
        "service: sglang.service is not-found",
        "venv: %s is missing" % host.venv,
        "weights: %s is missing; weights: %s is missing" % tuple(host.weights),
        "known-good: record is missing, declared fp-declared",
    ]
    assert state["patch"]["checked"] is False
    assert state["known_good"]["problem"] is None


def test_patch_set_that_cannot_be_checked_is_a_difference(host):
    host.in_sync()
    state = host.read(checksums={host.patch.name: "0" * 64})
    assert state["patch"]["failed"] is True
    assert state["differences"] == ["patch set: " + state["patch"]["msg"]]
    assert "0001-ddtree.patch" in state["patch"]["msg"]


def test_quarantine_record_is_read(host):
    host.in_sync()
    qdir = host.state_dir / "quarantine"
    qdir.mkdir()
    (qdir / "fp-declared.json").write_text(json.dumps({"since": "2026-12-03T10:00:00Z", "evidence": "/e/1"}))
    state = host.read()
    assert state["quarantine"]["exists"] is True
    assert state["quarantine"]["record"]["evidence"] == "/e/1"


def test_quarantine_is_read_where_known_good_keeps_it(host, tmp_path):
    """quarantine_dir (role known_good's known_good_quarantine_dir) decides where the record is."""
    host.in_sync()
    elsewhere = tmp_path / "kept-by-known-good"
    elsewhere.mkdir()
    (elsewhere / "fp-declared.json").write_text(json.dumps({"since": "2026-12-03T10:00:00Z", "evidence": "/e/2"}))
    state = host.read(quarantine_dir=str(elsewhere))
    assert state["quarantine"] == {"path": str(elsewhere / "fp-declared.json"), "exists": True,
                                   "record": {"since": "2026-12-03T10:00:00Z", "evidence": "/e/2"}}
    assert host.read()["quarantine"]["exists"] is False   # not under state_dir/quarantine
    assert not st.in_sync(state)


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("dangling", "which does not hold a record"),
        ("no-link", "although 1 record(s)"),
        ("checksum", "does not match its checksums"),
        ("unit-gone", "does not match its checksums"),
        ("bad-json", "does not match its checksums"),
        ("no-meta", "holds a unit or environment but no meta.json"),
    ],
)
def test_damaged_known_good_record_is_a_problem(host, damage, expected):
    host.in_sync()
    record = host.state_dir / "records" / "fp-declared"
    link = host.state_dir / "known-good"
    if damage == "dangling":
        link.unlink()
        link.symlink_to("records/gone")
    elif damage == "no-link":
        link.unlink()
    elif damage == "checksum":
        (record / "unit").write_text(UNIT + "# edited\n")
    elif damage == "unit-gone":
        (record / "unit").unlink()
    elif damage == "bad-json":
        (record / "meta.json").write_text("{not json")
    elif damage == "no-meta":
        (record / "meta.json").unlink()
    problem = host.read()["known_good"]["problem"]
    assert problem is not None and expected in problem, problem
    assert str(link) in problem


def test_new_host_without_records_has_no_problem(host):
    assert host.read()["known_good"]["problem"] is None


def test_venv_python_asked_when_lib_does_not_say(host, tmp_path):
    (host.venv).mkdir()
    calls = []

    def runner(argv, **_kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "3.12\n", "")

    assert st.venv_python_version(str(host.venv), "/usr/bin/python3.12", runner) == "3.12"
    assert calls[0][0] == "/usr/bin/python3.12"


def fake_bin(tmp_path, monkeypatch, **scripts):
    """A bin directory first on PATH: a systemctl that says active and enabled, and ``scripts``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    scripts.setdefault("systemctl", '[ "$1" = is-active ] && echo active || echo enabled')
    for name, body in scripts.items():
        (bindir / name).write_text("#!/bin/sh\n%s\n" % body)
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    return bindir


def test_module_reads_state_without_change(run_module, host, tmp_path, monkeypatch):
    host.in_sync()
    fake_bin(tmp_path, monkeypatch)
    res = run_module("host_state", host.params(gpu=False), check_mode=True)
    assert not res.failed, res.result
    assert res.result["changed"] is False
    assert res.result["differences"] == []
    assert res.result["live"]["active"] == "active"
    res = run_module("host_state", host.params(fingerprint="fp-other"))
    assert res.result["differences"] == ["known-good: record is fp-declared, declared fp-other"]


@pytest.mark.parametrize("change, why", [
    ("gpu_swapped", "the GPUs are not those the configuration was proven on"),
    ("gpu_unreadable", "nvidia-smi failed"),
    ("record_without_gpu", "a record from before GPUs were recorded"),
    ("lock_held", "another run holds the lock"),
    ("quarantined", "the declared configuration is quarantined"),
    ("no_difference_but_damaged", "the known-good record is damaged"),
])
def test_not_in_sync_unless_everything_holds(host, change, why):
    host.in_sync()
    record = host.state_dir / "records" / "fp-declared"
    if change == "gpu_swapped":
        host.smi = (A6000_QUERY.splitlines(True)[0], A6000_LIST.splitlines(True)[0])  # one card left
    elif change == "gpu_unreadable":
        host.smi = None
    elif change == "record_without_gpu":
        meta = json.loads((record / "meta.json").read_text())
        del meta["gpu"]
        (record / "meta.json").write_text(json.dumps(meta))
    elif change == "lock_held":
        host.lock_dir.mkdir(parents=True)
        (host.lock_dir / "owner.json").write_text(json.dumps({"run": "other", "pid": 42}))
    elif change == "quarantined":
        (host.state_dir / "quarantine").mkdir()
        (host.state_dir / "quarantine" / "fp-declared.json").write_text("{}")
    elif change == "no_difference_but_damaged":
        (record / "env").write_text(ENV + "X=1\n")
    state = host.read()
    assert state["in_sync"] is False, why
    if change == "gpu_unreadable":
        assert "exited 9" in state["gpu_error"] and state["gpu"] is None
    if change == "lock_held":
        assert state["lock"] == {"held": True, "owner": {"run": "other", "pid": 42}}
    if change == "gpu_swapped":
        assert state["gpu"]["count"] == 1 and state["differences"] == []


def test_gpu_not_read_unless_asked(host):
    state = host.in_sync().read(gpu=False)
    assert state["gpu"] is None and state["gpu_error"] is None and state["in_sync"] is False
    assert not any(c[0] == "/usr/bin/nvidia-smi" for c in host.calls)


LOGGING = '{"version": 1, "disable_existing_loggers": false}\n'


def with_logging_config(host, promoted=False):
    """A promoted host whose unit reads a logging config, recorded with the known-good record."""
    if not promoted:
        host.in_sync()
    logging_file = host.root / "etc" / "sglang-logging.json"
    logging_file.write_text(LOGGING)
    record = host.state_dir / "records" / "fp-declared"
    (record / "logging").write_text(LOGGING)
    meta = json.loads((record / "meta.json").read_text())
    meta["logging_sha256"] = sha(LOGGING, "sha256")
    (record / "meta.json").write_text(json.dumps(meta))
    return logging_file, {"logging_file": str(logging_file), "logging_sha1": sha(LOGGING, "sha1")}


def test_logging_config_is_part_of_the_declared_state(host):
    logging_file, params = with_logging_config(host)
    state = host.read(**params)
    assert state["differences"] == [] and state["pending_change"] is False and state["in_sync"] is True
    assert state["live"]["logging"] == {"path": str(logging_file), "sha1": sha(LOGGING, "sha1"), "exists": True}
    assert state["known_good"]["files"]["logging"] == {"exists": True, "sha256": sha(LOGGING, "sha256")}
    logging_file.write_text(LOGGING.replace("false", "true"))
    state = host.read(**params)
    assert state["differences"] == ["logging config: %s differs from the declared one" % logging_file]
    assert state["pending_change"] is True and state["in_sync"] is False
    logging_file.unlink()
    state = host.read(**params)
    assert state["differences"] == ["logging config: %s is missing" % logging_file]
    assert state["pending_change"] is True


def test_record_without_logging_config_is_intact_one_that_lists_it_needs_it(host):
    # A record from before the logging config (no file, no logging_sha256): intact.
    host.in_sync()
    assert host.read()["known_good"]["problem"] is None
    _, params = with_logging_config(host, promoted=True)
    record = host.state_dir / "records" / "fp-declared"
    assert host.read(**params)["known_good"]["problem"] is None
    (record / "logging").write_text(LOGGING + "\n")
    assert "does not match its checksums" in host.read(**params)["known_good"]["problem"]
    (record / "logging").unlink()
    assert "does not match its checksums" in host.read(**params)["known_good"]["problem"]


def test_module_takes_the_logging_config_with_its_digest(run_module, host):
    _, params = with_logging_config(host)
    res = run_module("host_state", host.params(gpu=False, logging_file=params["logging_file"]))
    assert res.failed and "logging_sha1" in res.result["msg"], res.result


def test_force_makes_an_in_sync_host_go_through_the_change(run_module, host, tmp_path, monkeypatch):
    # quality_gate_always: nothing differs, and the host must still be changed and gated.
    host.in_sync()
    (tmp_path / "query.csv").write_text(A6000_QUERY)
    smi = fake_bin(tmp_path, monkeypatch, **{"nvidia-smi": "cat %s" % (tmp_path / "query.csv")}) / "nvidia-smi"
    plain = run_module("host_state", host.params(nvidia_smi=str(smi)))
    forced = run_module("host_state", host.params(nvidia_smi=str(smi), force=True))
    assert plain.result["in_sync"] is True, plain.result
    assert forced.result["in_sync"] is False
    assert forced.result["differences"] == plain.result["differences"] == []
    assert forced.result["pending_change"] is plain.result["pending_change"] is False


class FakeServer:
    """GET /model_info answers for read_served, recording what was asked."""

    def __init__(self, status=200, body=None, error=None):
        self.status, self.body, self.error, self.asked = status, body, error, []

    def __call__(self, url, path, api_key, timeout):
        self.asked.append((url, path, api_key, timeout))
        if self.error:
            raise self.error
        return self.status, self.body


def served(host, server, monkeypatch, **overrides):
    monkeypatch.setattr(st, "get_json", server)
    params = dict(served_url="http://127.0.0.1:30000", served_api_key="k3y",
                  served_model_path=str(host.weights[0]))
    params.update(overrides)
    return host.read(**params)


def test_a_server_on_its_declared_weights_is_in_sync(host, monkeypatch):
    server = FakeServer(body={"model_path": str(host.weights[0]) + "/", "weight_version": "default"})
    state = served(host.in_sync(), server, monkeypatch)
    assert state["in_sync"] is True and state["differences"] == []
    assert state["served"] == {"checked": True, "url": "http://127.0.0.1:30000", "declared": str(host.weights[0]),
                               "model_path": str(host.weights[0]) + "/", "weight_version": "default",
                               "differs": False, "error": ""}
    assert server.asked == [("http://127.0.0.1:30000", "/model_info", "k3y", st.SERVED_TIMEOUT)]


def test_weights_swapped_at_run_time_are_a_difference_of_the_service(host, monkeypatch):
    """/update_weights_from_disk moves /model_info's model_path while the unit stays as declared:
    drift lists it, and the service must change (the role restarts it onto the declared weights)."""
    state = served(host.in_sync(), FakeServer(body={"model_path": "/tmp/other-model"}), monkeypatch)
    assert state["differences"] == [
        "served model: http://127.0.0.1:30000 serves /tmp/other-model, declared %s "
        "(weights swapped at run time: restart)" % host.weights[0]]
    assert state["pending_change"] is True and state["in_sync"] is False and state["served"]["differs"]


@pytest.mark.parametrize("case, server, error", [
    ("inactive", FakeServer(body={"model_path": "/elsewhere"}), ""),
    ("unreachable", FakeServer(error=st.HttpError("connection refused")), "connection refused"),
    ("wrong key", FakeServer(status=401, body={"error": "Unauthorized"}), "GET /model_info answered 401"),
    ("no model_path", FakeServer(body={"served_model_name": "x"}), "GET /model_info answered 200"),
])
def test_a_server_that_does_not_say_is_not_judged(host, monkeypatch, case, server, error):
    host.in_sync()
    if case == "inactive":
        host.systemd["is-active"] = "inactive"
    state = served(host, server, monkeypatch)
    assert state["served"]["checked"] is False and state["served"]["differs"] is False
    assert state["served"]["error"] == error
    assert not [d for d in state["differences"] if d.startswith("served model")]
    assert (server.asked == []) == (case == "inactive")


def test_served_model_is_read_over_real_http(host):
    """The module's own HTTP client against a loopback server answering like SGLang's /model_info,
    with the key checked."""
    import http.server
    import threading

    declared = str(host.weights[0])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/model_info" and self.headers.get("Authorization") == "Bearer k3y"
            body = json.dumps({"model_path": "/swapped" if ok else None}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d" % server.server_address[1]
        good = st.read_served(url, "k3y", declared, "active")
        bad = st.read_served(url, "wrong", declared, "active")
    finally:
        server.shutdown()
        server.server_close()
    assert good["checked"] and good["differs"] and good["model_path"] == "/swapped"
    assert not bad["checked"] and bad["error"] == "GET /model_info answered 401"
