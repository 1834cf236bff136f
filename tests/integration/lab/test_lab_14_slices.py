"""Job slicing: a drift run cut into 4 slices over 8 hosts gives the fleet report of one run.

AWX runs a sliced job template as N jobs, each on its own part of the inventory (host i in part
i mod N), possibly on different nodes; each slice writes its own report files
(-e ddtree_slice=K/N) and bin/ddtree-report merges them. Here the 8 hosts are lab slots 12..15
(copies of the seeded ct129 and ct200, booted for this module and removed after it), one of
them drifted (its service stopped). The four slices run side by side, in check mode like an
audit job; merged, they must say per host exactly what one unsliced run over the 8 hosts says,
and the merged Prometheus textfile must carry all 8 hosts.
"""

from __future__ import annotations

import json
import subprocess

import labkit
import pytest

SLOTS = range(12, 16)
SLICES = 4
DRIFTED = "s13-ct200"


def _slot_hosts():
    hosts = []
    for k in SLOTS:
        hosts += json.loads((labkit.LAB_STATE / "slots" / str(k) / "hosts.json").read_text())
    return hosts


def _inventory(directory, hosts):
    """The 8 machines under their machine names, in their architecture groups, with the lab's
    group_vars and controller-side output kept in `directory`."""
    groups = {}
    for h in hosts:
        groups.setdefault(h["arch_group"], []).append(h)
    lines = ["---", "sglang_servers:", "  children:"]
    for group, members in groups.items():
        lines += [f"    {group}:", "      hosts:"]
        lines += [f"        {h['machine']}:\n          ansible_host: {h['address']}" for h in members]
    inv = directory / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text("\n".join(lines) + "\n")
    (inv / "group_vars" / "all" / "00-lab.yml").symlink_to(labkit.REPO / "inventory" / "lab" / "group_vars" / "all.yml")
    out = directory / "out"
    (inv / "group_vars" / "all" / "10-out.yml").write_text(
        f"---\nknown_good_artifacts_dir: {out}\n"
        f"run_report_dir: \"{out}/{{{{ ddtree_run_kind | default('deploy') }}}}\"\n"
        f"run_report_textfile_dir: {out}/drift\n")
    return inv, out


def _labctl(*args):
    """lab/labctl.py for hosts of this module's own (these are not the worker's slot)."""
    return subprocess.run([str(labkit.VENV_BIN / "python"), str(labkit.REPO / "lab" / "labctl.py"), *args],
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    up = _labctl("up", "--first-slot", str(SLOTS.start), "--slots", str(SLOTS.stop))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        hosts = _slot_hosts()
        assert len(hosts) == 8, hosts
        inv, out = _inventory(tmp_path_factory.mktemp("slices"), hosts)
        yield {"hosts": sorted(h["machine"] for h in hosts), "inventory": inv, "out": out}
    finally:
        for k in SLOTS:
            fleet_file = labkit.LAB_STATE / "slots" / str(k) / "fleet.json"
            if fleet_file.exists():
                _labctl("down", "--fleet", str(fleet_file))


def _drift_argv(fleet, *args):
    """drift.yml in check mode (an audit), declaring what the hosts were seeded with (lab_seed.yml)."""
    return [str(labkit.VENV_BIN / "ansible-playbook"), "drift.yml", "--check", "-i", str(fleet["inventory"]),
            "-e", "sglang_speculative_algorithm={{ sglang_known_good_algorithm }}", *args]


@pytest.fixture(scope="module")
def runs(fleet):
    stop = labkit.run_ansible("-i", str(fleet["inventory"]), DRIFTED, "-m", "ansible.builtin.systemd_service",
                              "-a", "name=sglang.service state=stopped")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    whole = labkit.run_playbook(*_drift_argv(fleet)[1:])
    assert whole.rc == 0, str(whole)
    report_dir = fleet["out"] / "drift"
    unsliced = json.loads((report_dir / "latest.json").read_text())
    unsliced_prom = (report_dir / "ddtree_fleet_drift.prom").read_text()

    # AWX's cut: host i of the inventory goes to slice (i mod N) + 1; the four run side by side.
    parts = {k: [h for i, h in enumerate(fleet["hosts"]) if i % SLICES == k - 1] for k in range(1, SLICES + 1)}
    procs = {}
    for k, hosts in parts.items():
        argv = _drift_argv(fleet, "-l", ",".join(hosts), "-e", f"ddtree_slice={k}/{SLICES}")
        log = labkit.run_log(argv).open("w")
        procs[k] = (subprocess.Popen(argv, cwd=labkit.REPO, env=labkit.ansible_env(), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, text=True), log)
    rcs = {}
    for k, (proc, log) in procs.items():
        rcs[k] = proc.wait(timeout=900)
        log.close()
    merged_json, merged_prom = fleet["out"] / "fleet.json", fleet["out"] / "fleet.prom"
    merge = subprocess.run([str(labkit.VENV_BIN / "python"), str(labkit.REPO / "bin" / "ddtree-report"), "merge",
                            str(report_dir), "--out", str(merged_json), "--textfile", str(merged_prom)],
                           capture_output=True, text=True, timeout=60, check=False)
    return {"parts": parts, "rcs": rcs, "merge": merge, "unsliced": unsliced, "unsliced_prom": unsliced_prom,
            "report_dir": report_dir, "merged": merged_json, "merged_prom": merged_prom}


def test_each_slice_writes_its_own_report(runs):
    assert runs["rcs"] == {k: 0 for k in range(1, SLICES + 1)}, runs["rcs"]
    for k, hosts in runs["parts"].items():
        report = json.loads((runs["report_dir"] / f"latest.slice-{k}-of-{SLICES}.json").read_text())
        assert report["slice"] == {"number": k, "count": SLICES}
        assert sorted(e["host"] for e in report["hosts"]) == sorted(hosts), report["hosts"]
        prom = (runs["report_dir"] / f"ddtree_fleet_drift.slice-{k}-of-{SLICES}.prom").read_text()
        assert all(f'host="{h}"' in prom for h in hosts)


def test_merged_report_is_the_unsliced_runs(runs):
    assert runs["merge"].returncode == 0, runs["merge"].stderr
    merged = json.loads(runs["merged"].read_text())
    keys = ("status", "outcome", "differences", "fingerprint", "known_good", "quarantine")

    def per_host(report):
        return {e["host"]: {k: e[k] for k in keys} for e in report["hosts"]}

    unsliced = per_host(runs["unsliced"])
    assert len(unsliced) == 8
    assert per_host(merged) == unsliced
    assert unsliced[DRIFTED]["status"] == "drifted", unsliced[DRIFTED]
    assert "service: sglang.service is inactive" in unsliced[DRIFTED]["differences"]
    assert {h for h, e in unsliced.items() if e["status"] == "in_sync"} == set(unsliced) - {DRIFTED}


def test_merged_textfile_is_the_unsliced_runs(runs):
    def series(text):
        return sorted(line for line in text.splitlines()
                      if line and not line.startswith("ddtree_fleet_drift_last_run_timestamp_seconds"))

    merged = runs["merged_prom"].read_text()
    assert series(merged) == series(runs["unsliced_prom"])
    assert f'ddtree_fleet_drift_status{{host="{DRIFTED}",status="drifted"}} 1' in merged
