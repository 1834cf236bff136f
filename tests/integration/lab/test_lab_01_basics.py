"""The lab itself: reachable by Ansible, real systemd, the right fake GPUs, the mirror, labctl
idempotence, and the repository's root group_vars applying to the playbooks."""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import labkit
import pytest

# What each lab host must look like (docs/lab-physics.md, the incident's hardware).
EXPECTED_GPUS = {
    "ct129": {"count": 2, "name": "NVIDIA RTX A6000", "compute_cap": "8.6", "memory_mib": "49140"},
    "ct200": {"count": 8, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "compute_cap": "12.0",
              "memory_mib": "97887"},
}
# Root group_vars/sm86.yml and group_vars/sm120.yml (role defaults would give 0.85 / 1 to both).
EXPECTED_VARS = {"ct129": ("0.85", "2"), "ct200": ("0.9", "1")}


def test_ansible_ping_reaches_every_host(lab):
    res = labkit.run_ansible("all", "-m", "ansible.builtin.ping", "-o")
    assert res.returncode == 0, res.stdout + res.stderr
    for host in labkit.LAB_HOSTS:
        assert re.search(rf"^{host} \| SUCCESS .*\"ping\": \"pong\"", res.stdout, re.M), res.stdout


@pytest.mark.parametrize("host", labkit.LAB_HOSTS)
def test_systemd_is_pid1_and_running(lab, host):
    res = labkit.ssh(host, "cat /proc/1/comm; systemctl is-system-running", check=False)
    comm, state = (res.stdout.split() + ["", ""])[:2]
    assert comm == "systemd", res.stdout
    failed = labkit.ssh(host, "systemctl --failed --no-legend --plain", check=False).stdout
    assert state == "running", f"{host}: systemctl is-system-running says {state!r}; failed units:\n{failed}"


@pytest.mark.parametrize("host", labkit.LAB_HOSTS)
def test_nvidia_smi_reports_the_hosts_gpus(lab, host):
    want = EXPECTED_GPUS[host]
    listing = labkit.ssh(host, "nvidia-smi -L").stdout.splitlines()
    assert len(listing) == want["count"], listing
    for i, line in enumerate(listing):
        assert re.fullmatch(rf"GPU {i}: {re.escape(want['name'])} \(UUID: GPU-[0-9a-f-]+\)", line), line
    uuids = {line.split("UUID: ")[1] for line in listing}
    assert len(uuids) == want["count"], "GPU UUIDs must be distinct"

    csv = labkit.ssh(host, "nvidia-smi --query-gpu=name,compute_cap,memory.total "
                           "--format=csv,noheader,nounits").stdout.splitlines()
    assert len(csv) == want["count"], csv
    for line in csv:
        assert [f.strip() for f in line.split(",")] == [want["name"], want["compute_cap"], want["memory_mib"]]


@pytest.mark.parametrize("host", labkit.LAB_HOSTS)
def test_host_reaches_the_lab_mirror(lab, host):
    index = labkit.ssh(host, "curl -fsS --max-time 10 http://10.213.0.1:8873/simple/").stdout
    assert re.search(r'href="[^"]*sglang/?"', index), index[:500]
    project = labkit.ssh(host, "curl -fsS --max-time 10 http://10.213.0.1:8873/simple/sglang/").stdout
    assert "sglang-0.5.23" in project, project[:500]


def test_labctl_up_is_idempotent(lab):
    def status():
        out = subprocess.run(labkit.labctl_argv("status"), cwd=labkit.REPO,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        return {h["name"]: h for h in json.loads(out)["hosts"]}

    before = status()
    services = {h: labkit.service(h) for h in labkit.LAB_HOSTS}
    res = subprocess.run(labkit.labctl_argv("up"), cwd=labkit.REPO,   # this worker's lab slot
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    after = status()
    for host in labkit.LAB_HOSTS:
        m = labkit.machine(host)   # ct129, or s<k>-ct129 in lab slot k
        assert before[m]["running"] and after[m]["running"], (before, after)
        assert after[m]["pid"] == before[m]["pid"], f"{m} was rebooted: {before[m]} -> {after[m]}"
        assert f"{m}: already running (pid {before[m]['pid']})" in res.stdout, res.stdout
        # The service inside was left alone as well.
        now = labkit.service(host)
        assert (now["MainPID"], now["ActiveEnterTimestamp"]) == (
            services[host]["MainPID"], services[host]["ActiveEnterTimestamp"])
    assert sorted(labkit.lab_hosts()) == sorted(labkit.LAB_HOSTS)
    assert labkit.run_ansible("all", "-m", "ansible.builtin.ping", "-o").returncode == 0


PRINT_VARS = """\
- name: Print the per-architecture settings (lab test, deleted after the run)
  hosts: sglang_servers
  gather_facts: false
  tasks:
    - name: Show them
      ansible.builtin.debug:
        msg: "VARS {{ inventory_hostname }} {{ sglang_mem_fraction_static }} {{ sglang_tp_size }}"
"""


def _printed_vars(run: labkit.Run) -> dict[str, tuple[str, str]]:
    assert run.rc == 0, str(run)
    return {h: (m, tp) for h, m, tp in re.findall(r"VARS (\S+) (\S+) (\S+)", run.out)}


def test_root_group_vars_apply_to_root_playbooks_and_playbooks_dir(lab):
    tag = uuid.uuid4().hex[:8]
    root_pb = labkit.REPO / f"zz-labtest-vars-{tag}.yml"
    sub_pb = labkit.REPO / "playbooks" / f"zz-labtest-vars-{tag}.yml"
    try:
        root_pb.write_text("---\n" + PRINT_VARS)
        # playbooks/ reaches the root playbooks the way lab_seed.yml does: import_playbook ../
        sub_pb.write_text(f"---\n- name: Import the root playbook\n"
                          f"  ansible.builtin.import_playbook: ../{root_pb.name}\n")
        assert _printed_vars(labkit.run_playbook(root_pb.name)) == EXPECTED_VARS
        assert _printed_vars(labkit.run_playbook(f"playbooks/{sub_pb.name}")) == EXPECTED_VARS
    finally:
        root_pb.unlink(missing_ok=True)
        sub_pb.unlink(missing_ok=True)


@pytest.mark.parametrize("host", labkit.LAB_HOSTS)
def test_seeded_unit_carries_the_group_vars(lab, host):
    """lab/playbooks/lab_seed.yml put the per-architecture values into the running unit."""
    mem, tp = EXPECTED_VARS[host]
    unit = labkit.read_text(host, labkit.UNIT)
    assert f"--mem-fraction-static {mem} " in unit and f"--tp-size {tp} " in unit, unit
    assert "--speculative-algorithm NEXTN " in unit, unit
