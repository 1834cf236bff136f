"""Scheduled drift correction (drift.yml): detection, correction through the gate, no flapping.

Acceptance of the drift issue on the lab:
- ct200 declared DDTREE: a hand-edited unit and a stopped service are both detected, corrected
  and probed; the next run reports in_sync and does not restart the service.
- ct129 after the DDTree rollback: three drift runs leave it on NEXTN, never restart it, and
  report quarantined; new declared sm86 settings lift the quarantine and the next run tries the
  new configuration through the gate.
- --check reports the differences and changes nothing.
"""
from __future__ import annotations

import json

import pytest

import labkit

DRIFT = labkit.ARTIFACTS / "drift"


def latest() -> dict:
    return json.loads((DRIFT / "latest.json").read_text())


def entry(report: dict, host: str) -> dict:
    return next(h for h in report["hosts"] if h["host"] == host)


def prom() -> str:
    return (DRIFT / "ddtree_fleet_drift.prom").read_text()


@pytest.fixture(scope="module")
def ct200_on_declared(lab):
    """ct200 converged to its declared DDTREE configuration by a first drift run."""
    run = labkit.run_playbook("drift.yml", "-l", "ct200")
    assert run.rc == 0, run
    e = entry(latest(), "ct200")
    assert e["status"] == "corrected", e  # seeded NEXTN -> declared DDTREE
    assert labkit.known_good("ct200")["meta"]["algorithm"] == "DDTREE"
    return run


def test_check_mode_reports_and_changes_nothing(lab):
    before = labkit.snapshot("ct200")
    run = labkit.run_playbook("drift.yml", "-l", "ct200", "--check", "--diff")
    assert run.rc == 0, run
    assert labkit.snapshot_diff(before, labkit.snapshot("ct200")) == ""
    e = entry(latest(), "ct200")
    assert latest()["check_mode"] is True
    assert e["status"] == "drifted"
    assert any("differs from the declared unit" in d for d in e["differences"]), e
    assert "--speculative-algorithm DDTREE" in run.out  # the --diff of the unit


def test_hand_edit_and_stopped_service_are_corrected_then_in_sync(ct200_on_declared):
    unit = labkit.UNIT
    labkit.ssh("ct200", f"sed -i 's/--cuda-graph-max-bs-decode 48/--cuda-graph-max-bs-decode 32/' {unit} && "
                        "systemctl daemon-reload && systemctl stop sglang.service")
    assert "32" in labkit.read_text("ct200", unit)
    run = labkit.run_playbook("drift.yml", "-l", "ct200")
    assert run.rc == 0, run
    e = entry(latest(), "ct200")
    assert e["status"] == "corrected", e
    assert any("differs from the declared unit" in d for d in e["differences"]), e
    assert any("sglang.service is inactive" in d for d in e["differences"]), e
    assert "--cuda-graph-max-bs-decode 48" in labkit.read_text("ct200", unit)
    assert labkit.service("ct200")["ActiveState"] == "active"
    assert "quality_gate : Probe the service" in run.out and "gate pass" in run.out
    labkit.record_timing("drift ct200 hand edit + stop corrected", play_wall=run.seconds)

    started = labkit.service("ct200")["ActiveEnterTimestamp"]
    again = labkit.run_playbook("drift.yml", "-l", "ct200")
    assert again.rc == 0, again
    assert entry(latest(), "ct200")["status"] == "in_sync"
    assert entry(latest(), "ct200")["differences"] == []
    assert again.recap("ct200")["changed"] == 0
    assert labkit.service("ct200")["ActiveEnterTimestamp"] == started  # not restarted
    assert 'ddtree_fleet_drift_status{host="ct200",status="in_sync"} 1' in prom()
    labkit.record_timing("drift ct200 in-sync run", play_wall=again.seconds)


# On the host, as root: the admin key from the unit's 0600 --config file (a random one per start,
# since the lab declares none), then a runtime weight swap, then what /model_info says.
SWAP = r"""
import json, re, sys, urllib.request
admin = re.search(r'admin-api-key: "([^"]+)"', open("/run/sglang/api-key.yaml").read()).group(1)
req = urllib.request.Request("http://127.0.0.1:30000/update_weights_from_disk", method="POST",
                             data=json.dumps({"model_path": sys.argv[1]}).encode(),
                             headers={"Authorization": "Bearer " + admin, "Content-Type": "application/json"})
print(urllib.request.urlopen(req, timeout=10).status)
"""
MODEL_PATH = ("python3 -c 'import json, urllib.request; "
              "print(json.load(urllib.request.urlopen(\"http://127.0.0.1:30000/model_info\", timeout=10))[\"model_path\"])'")


def test_weights_swapped_at_run_time_are_drift_and_restarted_away(ct200_on_declared):
    """/update_weights_from_disk (with the admin key) moves the served model while the unit, its
    files and the known-good record stay as declared: drift reads /model_info, reports the swap
    and restarts the service onto the declared weights through the gate."""
    declared = labkit.known_good("ct200")["meta"]["model_dir"]
    swap = labkit.ssh("ct200", "python3 - /opt/elsewhere/other-model <<'PY'\n" + SWAP + "PY")
    assert swap.stdout.strip() == "200", swap
    assert labkit.ssh("ct200", MODEL_PATH).stdout.strip() == "/opt/elsewhere/other-model"
    started = labkit.service("ct200")["ActiveEnterTimestamp"]
    run = labkit.run_playbook("drift.yml", "-l", "ct200")
    assert run.rc == 0, run
    e = entry(latest(), "ct200")
    assert e["status"] == "corrected", e
    assert e["differences"] == [f"served model: http://127.0.0.1:30000 serves /opt/elsewhere/other-model, "
                                f"declared {declared} (weights swapped at run time: restart)"], e
    assert labkit.service("ct200")["ActiveEnterTimestamp"] != started   # restarted onto the declared weights
    assert labkit.ssh("ct200", MODEL_PATH).stdout.strip() == declared
    assert labkit.known_good("ct200")["meta"]["model_dir"] == declared
    labkit.record_timing("drift ct200 runtime weight swap restarted away", play_wall=run.seconds)


def test_quarantine_does_not_flap_and_is_lifted_by_new_settings(lab):
    first = labkit.run_playbook("deploy_ddtree.yml", "-l", "ct129")
    assert first.rc != 0 and "ct129" in first.out
    quarantined = labkit.quarantine_files("ct129")
    assert len(quarantined) == 1
    nextn_unit = labkit.sha256("ct129", labkit.UNIT)[labkit.UNIT]
    started = labkit.service("ct129")["ActiveEnterTimestamp"]
    for i in range(3):
        run = labkit.run_playbook("drift.yml", "-l", "ct129")
        assert run.rc == 0, run
        e = entry(latest(), "ct129")
        assert e["status"] == "quarantined", e
        assert e["message"].startswith("quarantined: " + quarantined[0][:-5] + ", since "), e
        assert "evidence at " in e["message"]
        assert labkit.service("ct129")["ActiveEnterTimestamp"] == started, f"run {i + 1} restarted ct129"
        assert labkit.sha256("ct129", labkit.UNIT)[labkit.UNIT] == nextn_unit
    assert 'ddtree_fleet_drift_status{host="ct129",status="quarantined"} 1' in prom()

    # New declared sm86 settings: a new fingerprint, so the gate decides again (and fails again).
    retry = labkit.run_playbook("drift.yml", "-l", "ct129", "-e", "sglang_cuda_graph_max_bs=8")
    assert retry.rc != 0, retry
    assert "quality_gate : Probe the service" in retry.out
    e = entry(latest(), "ct129")
    assert e["status"] == "failed" and e["evidence"], e
    assert len(labkit.quarantine_files("ct129")) == 2
    assert labkit.sha256("ct129", labkit.UNIT)[labkit.UNIT] == nextn_unit  # back on known-good
    labkit.clear_quarantine("ct129")
