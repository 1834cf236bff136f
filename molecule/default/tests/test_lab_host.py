"""Verify a lab host booted by labctl and converged with the lab_heartbeat test role."""

import json
import os

import pytest

# What each host's fake nvidia-smi must report (lab/fleet.json profiles of fleet.json's hosts).
EXPECTED_GPUS = {
    "mol-a": ("NVIDIA RTX A6000", 2),
    "mol-b": ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 8),
}
MIRROR = "http://10.213.0.1:8873/simple/"
HEARTBEAT_PORT = 8765


def _name(host):
    return host.ansible.get_variables()["inventory_hostname"]


def test_fleet_file_matches_expectations():
    fleet = json.load(open(os.path.join(os.path.dirname(__file__), "..", "fleet.json")))
    assert sorted(h["name"] for h in fleet["hosts"]) == sorted(EXPECTED_GPUS)
    # Never the main lab's subnets (lab/fleet.json uses 1 and 2).
    assert all(h["index"] >= 20 for h in fleet["hosts"])


def test_systemd_is_pid1_and_running(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    state = host.run("systemctl is-system-running")
    assert state.stdout.strip() == "running", state.stdout + state.stderr
    assert host.run("systemctl --failed --no-legend --plain").stdout.strip() == ""


def test_hostname_is_the_instance_name(host):
    assert host.check_output("hostname") == _name(host)


def test_sshd_is_up(host):
    assert host.service("ssh").is_running
    assert host.socket("tcp://0.0.0.0:22").is_listening


def test_nvidia_smi_lists_the_profile_gpus(host):
    name, count = EXPECTED_GPUS[_name(host)]
    lines = host.check_output("nvidia-smi -L").splitlines()
    assert len(lines) == count, lines
    assert all(f": {name} (UUID: GPU-" in line for line in lines), lines
    assert [line.split(":")[0] for line in lines] == [f"GPU {i}" for i in range(count)]


def test_nvidia_smi_query_gives_the_arch(host):
    caps = host.check_output("nvidia-smi --query-gpu=compute_cap --format=csv,noheader").split()
    expected = "8.6" if _name(host) == "mol-a" else "12.0"
    assert set(caps) == {expected}


def test_mirror_reachable_from_the_host(host):
    out = host.run(f"curl -fsS --max-time 10 {MIRROR}")
    assert out.rc == 0, out.stderr
    assert 'href="sglang/"' in out.stdout
    assert 'href="sglang-lab-standin/"' in out.stdout


def test_heartbeat_unit_is_active_and_enabled(host):
    svc = host.service("ddtree-heartbeat.service")
    assert svc.is_running
    assert svc.is_enabled
    assert host.socket(f"tcp://127.0.0.1:{HEARTBEAT_PORT}").is_listening


def test_heartbeat_runs_unprivileged(host):
    pid = host.check_output("systemctl show -p MainPID --value ddtree-heartbeat.service")
    assert int(pid) > 0
    uid = host.check_output(f"stat -c %u /proc/{pid}")
    assert int(uid) != 0


def test_marker_served_by_the_unit(host):
    marker = host.file("/var/lib/ddtree-heartbeat/marker")
    assert marker.is_file
    assert marker.mode == 0o644
    assert marker.content_string == f"ddtree-molecule {_name(host)}\n"
    out = host.check_output(f"curl -fsS --max-time 5 http://127.0.0.1:{HEARTBEAT_PORT}/marker")
    assert out == f"ddtree-molecule {_name(host)}"


@pytest.mark.parametrize("path", ["/etc/ddtree-lab/gpus.csv", "/usr/bin/nvidia-smi"])
def test_lab_scaffolding_present(host, path):
    assert host.file(path).exists
