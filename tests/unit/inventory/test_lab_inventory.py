"""inventory/lab/lab_hosts.py: the lab hosts beyond hosts.yml, from the lab's state file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "inventory" / "lab" / "lab_hosts.py"

import lab_hosts  # noqa: E402


@pytest.fixture
def fake_container():
    """Processes whose command line looks like a lab host's nspawn (`... -M <name> ...`)."""
    procs = []

    def start(name: str) -> int:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-M", name, "-b"])
        procs.append(p)
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait()


def lab_state(tmp_path: Path, entries: list[dict], running: dict[str, int]) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "hosts.json").write_text(json.dumps(entries))
    for name, pid in running.items():
        (state / "hosts" / name).mkdir(parents=True)
        (state / "hosts" / name / "nspawn.pid").write_text(f"{pid}\n")
    return state


def entry(name: str, index: int, group: str) -> dict:
    return {"name": name, "address": f"10.213.{index}.2", "arch_group": group, "gpus": 2,
            "identity_file": "/var/lib/ddtree-lab/ssh/id_ed25519", "known_hosts": "/var/lib/ddtree-lab/ssh/known_hosts"}


def run_script(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDTREE_LAB_STATE": str(state)}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=30)


def test_static_hosts_of_the_real_hosts_yml():
    assert lab_hosts.static_hosts(REPO / "inventory" / "lab" / "hosts.yml") == {"ct129", "ct200"}


def test_static_hosts_parser_handles_flow_and_comments(tmp_path):
    f = tmp_path / "hosts.yml"
    f.write_text("---\n# comment\nall:\n  children:\n    a:\n      hosts:\n        h1:  # first\n"
                 "          ansible_host: 1.2.3.4\n        h2:\n    b:\n      hosts: {h3: {}, h4: {x: 1}}\n"
                 "    c:\n      hosts: {}\n      vars:\n        hosts_like: 1\n")
    assert lab_hosts.static_hosts(f) == {"h1", "h2", "h3", "h4"}


def test_eight_hosts_grouped_by_architecture(tmp_path, fake_container):
    names = [("ct129", 1, "sm86"), ("ct200", 2, "sm120")] + [
        (f"lab{i:02d}", i, "sm86" if i % 2 else "sm120") for i in range(3, 9)]
    state = lab_state(tmp_path, [entry(*n) for n in names], {n: fake_container(n) for n, _, _ in names})
    res = run_script(state, "--list")
    assert res.returncode == 0, res.stderr
    inv = json.loads(res.stdout)
    assert inv["sm86"]["hosts"] == ["lab03", "lab05", "lab07"]
    assert inv["sm120"]["hosts"] == ["lab04", "lab06", "lab08"]
    assert sorted(inv["sglang_servers"]["children"]) == ["sm120", "sm86"]
    assert inv["_meta"]["hostvars"]["lab05"] == {"ansible_host": "10.213.5.2"}
    assert "ct129" not in inv["_meta"]["hostvars"] and "ct200" not in inv["_meta"]["hostvars"]


def test_nothing_when_the_state_file_is_absent(tmp_path):
    res = run_script(tmp_path / "nowhere", "--list")
    assert res.returncode == 0
    assert json.loads(res.stdout) == {"_meta": {"hostvars": {}}}


def test_nothing_when_the_state_file_is_garbage(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "hosts.json").write_text("{not json")
    assert json.loads(run_script(state, "--list").stdout) == {"_meta": {"hostvars": {}}}


def test_hosts_whose_container_is_gone_are_left_out(tmp_path, fake_container):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state = lab_state(tmp_path, [entry("lab03", 3, "sm86"), entry("lab04", 4, "sm120"), entry("lab05", 5, "sm86")],
                      {"lab03": fake_container("lab03"), "lab04": gone.pid})
    inv = json.loads(run_script(state, "--list").stdout)
    assert inv["sm86"]["hosts"] == ["lab03"]
    assert "sm120" not in inv
    # a live PID that is not that host's container does not count either
    (state / "hosts" / "lab04" / "nspawn.pid").write_text(str(os.getpid()))
    assert "sm120" not in json.loads(run_script(state, "--list").stdout)


def test_lab_down_means_empty(tmp_path, fake_container):
    """labctl down removes hosts.json: the script then lists nothing, whatever else is on disk."""
    state = lab_state(tmp_path, [entry("lab03", 3, "sm86")], {"lab03": fake_container("lab03")})
    assert json.loads(run_script(state, "--list").stdout)["sm86"]["hosts"] == ["lab03"]
    (state / "hosts.json").unlink()
    assert json.loads(run_script(state, "--list").stdout) == {"_meta": {"hostvars": {}}}


def test_host_and_usage(tmp_path):
    assert json.loads(run_script(tmp_path, "--host", "lab03").stdout) == {}
    assert run_script(tmp_path, "--bogus").returncode == 2


def test_bad_entries_are_skipped(tmp_path, fake_container):
    bad = [{"name": "x; rm -rf /", "address": "10.213.9.2", "arch_group": "sm86"},
           {"name": "lab09", "arch_group": "sm86"}, "junk", entry("lab10", 10, "sm120")]
    state = lab_state(tmp_path, bad, {"lab10": fake_container("lab10"), "lab09": fake_container("lab09")})
    inv = json.loads(run_script(state, "--list").stdout)
    assert list(inv["_meta"]["hostvars"]) == ["lab10"]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "ansible-inventory").exists(), reason="no .venv")
def test_ansible_reads_the_directory_with_the_script(tmp_path, fake_container):
    """The whole inventory/lab directory through ansible-inventory: hosts.yml + the script."""
    inv_dir = tmp_path / "inv"
    inv_dir.mkdir()
    shutil.copy(REPO / "inventory" / "lab" / "hosts.yml", inv_dir / "hosts.yml")
    shutil.copy(SCRIPT, inv_dir / "lab_hosts.py")
    state = lab_state(tmp_path, [entry("ct129", 1, "sm86"), entry("lab03", 3, "sm86"), entry("lab04", 4, "sm120")],
                      {"ct129": fake_container("ct129"), "lab03": fake_container("lab03"), "lab04": fake_container("lab04")})
    env = {**os.environ, "DDTREE_LAB_STATE": str(state), "ANSIBLE_HOME": str(tmp_path / "ah"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "lt")}
    t0 = time.time()
    res = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-inventory"), "-i", str(inv_dir), "--list"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    inv = json.loads(res.stdout)
    assert sorted(inv["sm86"]["hosts"]) == ["ct129", "lab03"]
    assert sorted(inv["sm120"]["hosts"]) == ["ct200", "lab04"]
    assert inv["_meta"]["hostvars"]["lab03"]["ansible_host"] == "10.213.3.2"
    assert "[WARNING]" not in res.stderr, res.stderr
    assert time.time() - t0 < 60
