"""lab/mirror/serve.py on 127.0.0.1: byte ranges and the fault switches the weights tests use."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from standin_testlib import free_port, port_open, wait_for

SERVE = Path(__file__).resolve().parents[3] / "lab" / "mirror" / "serve.py"
BODY = bytes(range(256)) * 64   # 16 KiB
URL_PATH = "/models/org/m/rev/model.safetensors"


@pytest.fixture
def mirror(tmp_path):
    root = tmp_path / "root"
    (root / "models/org/m/rev").mkdir(parents=True)
    (root / "models/org/m/rev/model.safetensors").write_bytes(BODY)
    faults = tmp_path / "faults.json"
    (tmp_path / "faults.d").mkdir()
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVE), "--bind", "127.0.0.1", "--port", str(port),
                             "--root", str(root), "--faults", str(faults), "--faults-dir", str(tmp_path / "faults.d")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: port_open(port), 10)
    yield f"http://127.0.0.1:{port}", faults
    proc.terminate()
    proc.wait(timeout=5)


def get_raw(base: str) -> tuple[int, bytes, bool]:
    """(declared length, bytes received, whether the body arrived complete)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", URL_PATH)
    resp = conn.getresponse()
    declared = int(resp.getheader("Content-Length"))
    try:
        data = resp.read()
        return declared, data, True
    except http.client.IncompleteRead as exc:
        return declared, exc.partial, False
    finally:
        conn.close()


def set_faults(path: Path, table: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table))
    os.replace(tmp, path)


def test_no_fault_file_serves_the_file_and_ranges(mirror):
    base, _ = mirror
    assert requests.get(base + URL_PATH, timeout=5).content == BODY
    r = requests.get(base + URL_PATH, headers={"Range": "bytes=100-"}, timeout=5)
    assert r.status_code == 206 and r.content == BODY[100:]


def test_cut_sends_half_then_closes_once(mirror):
    base, faults = mirror
    set_faults(faults, {URL_PATH: {"mode": "cut", "times": 1}})
    declared, data, complete = get_raw(base)
    assert declared == len(BODY) and not complete and data == BODY[: len(BODY) // 2]
    assert requests.get(base + URL_PATH, timeout=5).content == BODY   # only once


def test_corrupt_keeps_the_length_but_not_the_checksum_every_time(mirror):
    base, faults = mirror
    set_faults(faults, {URL_PATH: {"mode": "corrupt"}})
    for _ in range(3):
        body = requests.get(base + URL_PATH, timeout=5).content
        assert len(body) == len(BODY) and hashlib.sha256(body).digest() != hashlib.sha256(BODY).digest()


def test_rewriting_the_file_rearms_and_other_paths_are_untouched(mirror):
    base, faults = mirror
    set_faults(faults, {URL_PATH: {"mode": "cut", "times": 1}})
    assert not get_raw(base)[2]
    assert get_raw(base)[2]
    os.utime(faults, ns=(1, 1))   # a new version of the file
    assert not get_raw(base)[2]
    set_faults(faults, {"/other": {"mode": "corrupt"}})
    assert requests.get(base + URL_PATH, timeout=5).content == BODY


def test_faults_of_one_lab_slot_hit_only_its_own_host(mirror):
    """Tables in --faults-dir, one per test worker, scoped by "client": a fault for another
    host's address leaves this client's downloads alone; one for this client hits it."""
    base, faults = mirror
    slots = faults.parent / "faults.d"
    set_faults(slots / "slot1.json", {URL_PATH: {"mode": "corrupt", "client": "10.213.62.2"}})
    assert requests.get(base + URL_PATH, timeout=5).content == BODY
    set_faults(slots / "slot2.json", {URL_PATH: {"mode": "cut", "times": 1, "client": "127.0.0.1"}})
    assert not get_raw(base)[2]
    assert requests.get(base + URL_PATH, timeout=5).content == BODY   # times 1: once
    (slots / "slot2.json").unlink()
    set_faults(faults, {URL_PATH: {"mode": "cut", "times": 1}})   # unscoped: every client
    assert not get_raw(base)[2]
