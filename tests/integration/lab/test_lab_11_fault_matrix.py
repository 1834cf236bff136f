"""The fault matrix: one case per way a change can go wrong, each asserting the end state.

For every case the host must end serving a probed configuration (the new one or known-good),
with the known-good record intact, evidence where a change failed, and a run whose exit code and
message say what happened. The table of cases (pass/fail, seconds, end state) is printed at the
end of the session and written to artifacts/fault-matrix.md (tests/integration/lab/conftest.py).

Service faults are injected into the candidate only: /etc/ddtree-lab/faults.env with
DDTREE_LAB_FAULT_ONLY=DDTREE (docs/lab-physics.md), on ct200 where DDTREE passes when healthy, so
each failure is the injected one. Weights faults go through the lab mirror's fault tables
(lab/mirror/serve.py), one file per lab slot, scoped to the slot's own host address, so cases
that run side by side on other slots download unharmed; connectivity faults cut the host's veth, interrupt the controller, or
power-cycle the container (lab/labctl.py restart).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time

import labkit
import pytest

HOST = "ct200"
FAULTS_ENV = "/etc/ddtree-lab/faults.env"
DRAFT_ROOT = "/opt/sglang/models/z-lab--Qwen3.6-27B-DFlash"
DRAFT_REV = "d39dc817302d4258a2161e9c3e5465a2ed620951"
DRAFT_FILE_URL = f"/models/z-lab/Qwen3.6-27B-DFlash/{DRAFT_REV}/model.safetensors"
MIRROR_FAULTS = labkit.LAB_STATE / "mirror-faults.d" / f"slot{labkit.SLOT}.json"
MIRROR_LOG = labkit.LAB_STATE / "mirror.log"
WATCHDOG = ["-e", "known_good_watchdog_seconds=20"]
FAILED_CHANGE = "the DDTREE change failed"


# ------------------------------------------------------------------ helpers

def set_fault(host: str, fault: str, only: str) -> None:
    labkit.ssh(host, f"mkdir -p /etc/ddtree-lab && printf 'DDTREE_LAB_FAULT=%s\\nDDTREE_LAB_FAULT_ONLY=%s\\n' "
                     f"{shlex.quote(fault)} {shlex.quote(only)} > {FAULTS_ENV}")


def clear_fault(host: str) -> None:
    labkit.ssh(host, f"rm -f {FAULTS_ENV}")


def set_mirror_fault(mode: str | None, times: int = -1) -> None:
    if mode is None:
        MIRROR_FAULTS.unlink(missing_ok=True)
        return
    MIRROR_FAULTS.parent.mkdir(parents=True, exist_ok=True)
    client = labkit.lab_hosts()[HOST]["address"]   # only this slot's host sees the fault
    tmp = MIRROR_FAULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps({DRAFT_FILE_URL: {"mode": mode, "times": times, "client": client}}))
    tmp.replace(MIRROR_FAULTS)


def mirror_fault_hits(mode: str) -> int:
    """Faulted responses the mirror logged for this slot's host (its log line starts with the client)."""
    text = MIRROR_LOG.read_text(errors="replace") if MIRROR_LOG.exists() else ""
    client = labkit.lab_hosts()[HOST]["address"]
    return sum(1 for line in text.splitlines()
               if line.startswith(f"{client} ") and f"lab fault {mode} on {DRAFT_FILE_URL}" in line)


def flat(run: labkit.Run) -> str:
    return " ".join(run.out.split())


def serving_known_good(host: str, kg: dict) -> str:
    """Assert the host serves its intact known-good record and the probe passes; a summary."""
    now = labkit.known_good(host)
    assert now["link"] == kg["link"] and now["unit_sha256"] == kg["unit_sha256"] \
        and now["env_sha256"] == kg["env_sha256"], f"known-good record changed: {kg} -> {now}"
    live = labkit.sha256(host, labkit.UNIT, labkit.ENV_FILE)
    assert live[labkit.UNIT] == kg["unit_sha256"] and live[labkit.ENV_FILE] == kg["env_sha256"], \
        "the live unit/env are not the known-good ones"
    svc = labkit.service(host)
    assert svc["ActiveState"] == "active", svc
    rc, report, err = labkit.probe(host)
    assert rc == 0 and report["verdict"] == "pass", (rc, report and report.get("reasons"), err)
    return f"known-good {kg['meta']['algorithm']} serving, probe pass"


def serving_restored(host: str, kg: dict, timeout: float = 90) -> str:
    labkit.wait_until(lambda: labkit.sha256(host, labkit.UNIT)[labkit.UNIT] == kg["unit_sha256"]
                      and labkit.service(host).get("ActiveState") == "active", timeout,
                      what=f"{host} back on its known-good unit")
    labkit.wait_until(lambda: labkit.probe(host)[0] == 0, 60, 1.0, what=f"{host} known-good answering the probe")
    return serving_known_good(host, kg)


def candidate_running(host: str) -> bool:
    """The DDTREE candidate is the service's running process (not only the unit file on disk,
    which is in place a few tasks before the restart while the old process still runs)."""
    cmd = ("pid=$(systemctl show -p MainPID --value sglang.service); "
           "[ \"${pid:-0}\" -gt 0 ] && tr '\\0' ' ' < /proc/$pid/cmdline")
    return "--speculative-algorithm DDTREE" in labkit.ssh(host, cmd, check=False).stdout


def host_evidence(host: str, before: set[str]) -> tuple[str, str]:
    """The newest watchdog evidence directory on the host that was not there before: (dir, trigger)."""
    out = labkit.ssh(host, f"ls -1d {labkit.STATE_DIR}/evidence/watchdog-* 2>/dev/null || true").stdout.split()
    new = sorted(set(out) - before)
    assert new, f"no new watchdog evidence under {labkit.STATE_DIR}/evidence on {host}"
    files = labkit.ssh(host, f"ls -1 {new[-1]}").stdout.split()
    assert {"trigger", "journal.txt", "unit", "change.json"} <= set(files), files
    return new[-1], labkit.read_text(host, f"{new[-1]}/trigger").strip()


def watchdog_dirs(host: str) -> set[str]:
    return set(labkit.ssh(host, f"ls -1d {labkit.STATE_DIR}/evidence/watchdog-* 2>/dev/null || true").stdout.split())


def veth_host(host: str) -> str:
    index = int(labkit.lab_hosts()[host]["address"].split(".")[2])
    return f"ddl{index}h"


@pytest.fixture
def ready(lab, record_property):
    """The case's host starts seeded (known-good NEXTN, no quarantine), without faults."""
    for h in labkit.LAB_HOSTS:
        clear_fault(h)
    set_mirror_fault(None)
    labkit.ensure_seeded("fault matrix case")
    yield record_property
    for h in labkit.LAB_HOSTS:
        clear_fault(h)
        labkit.clear_quarantine(h)
    set_mirror_fault(None)


# ------------------------------------------------------------------ the service fails under the gate

SERVICE_FAULTS = [
    # case, DDTREE_LAB_FAULT, extra args, what the run's failure must say
    ("unit fails to start", "exit_on_start", [], r"exited|failed|inactive"),
    ("never healthy within the timeout", "never_healthy", ["-e", "sglang_service_start_timeout=15"],
     r"not healthy|did not become healthy|timed out|timeout"),
    ("crash on the first request", "crash_on_first_request", [], r"quality gate"),
    ("hang mid-stream", "hang_midstream", [], r"quality gate"),
    ("answers HTTP 500", "http_500", [], r"quality gate"),
    ("garbage, fast", "garbage_fast", [], r"quality gate"),
    ("correct text, far too slow", "slow_text", [], r"quality gate"),
    # Caught under the speed gate's load (its requests get 503) or, when the gate ended first, by the soak.
    ("unhealthy a few seconds after passing (speed gate or soak)", "unhealthy_after:5", [],
     r"speed gate \(fail\).*failed under load|soak"),
    ("fluent, fast, healthy, but not lossless", "lossless_violation", [],
     r"quality gate.*lossless_violation: freeform: diverges from the baseline at token \d+"),
]


@pytest.mark.parametrize("case,fault,extra,expect", [
    pytest.param(*c, marks=pytest.mark.fault_case(c[0]), id=c[1].split(":")[0]) for c in SERVICE_FAULTS])
def test_service_fault_is_rolled_back(ready, case, fault, extra, expect):
    kg = labkit.known_good(HOST)
    before = labkit.evidence_dirs(HOST)
    set_fault(HOST, fault, only="DDTREE")
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST, *extra)
    clear_fault(HOST)
    assert run.rc == 2, str(run)
    text = flat(run)
    assert f"{HOST}: {FAILED_CHANGE}" in text, run.tail()
    assert re.search(expect, text, re.I), f"{expect!r} not in the failure:\n{run.tail()}"
    assert f"Known-good {kg['meta']['fingerprint']} restored, healthy and probed" in text, run.tail()
    evidence = labkit.new_evidence_dir(HOST, before)
    summary = json.loads((evidence / "summary.json").read_text())
    assert summary["algorithm"] == "DDTREE" and summary["known_good_fingerprint"] == kg["meta"]["fingerprint"]
    assert (evidence / "journal.txt").stat().st_size > 0
    restored = json.loads((evidence / "restored-probe-report.json").read_text())
    assert restored["verdict"] == "pass", restored.get("reasons")
    assert f"{summary['fingerprint']}.json" in labkit.quarantine_files(HOST)
    if fault == "lossless_violation":
        # The evidence names where the outputs part, the baseline's margin and both continuations.
        report = json.loads((evidence / "probe-report.json").read_text())
        free = {e["name"]: e for e in report["baseline"]["prompts"]}["freeform"]["agreement"]
        assert free["status"] == "violation" and free["baseline_margin"] >= 0.5, free
        assert free["baseline_continuation"] and free["candidate_continuation"] \
            and free["baseline_continuation"] != free["candidate_continuation"], free
        assert all(p["verdict"] == "pass" for p in report["prompts"]), "only agreement may fail"
        assert any(repr(free["candidate_continuation"]) in r for r in summary["reasons"]), \
            summary["reasons"]
    state = serving_known_good(HOST, kg)
    ready("end_state", f"rc 2, rolled back; {state}; evidence {evidence.name}; reason: "
                       f"{(summary['reasons'] or [summary['message']])[0][:70]}")


@pytest.mark.fault_case("differs from known-good only at near ties: passes")
def test_candidate_that_differs_only_at_near_ties_is_promoted(ready):
    """Kernel numerics may flip a near tie of the target: not a lossless violation, promoted."""
    set_fault(HOST, "near_tie_flip", only="DDTREE")
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
    clear_fault(HOST)
    assert run.rc == 0, str(run)
    kg = labkit.known_good(HOST)
    assert kg["meta"]["algorithm"] == "DDTREE", kg["meta"]
    assert kg["meta"]["gate"]["verdict"] == "pass", kg["meta"]
    warned = [w for w in kg["meta"]["gate"]["warnings"] if w.startswith("near_tie: freeform")]
    assert len(warned) == 1 and "a near tie of the baseline (top-2 margin" in warned[0], kg["meta"]
    ready("end_state", "rc 0, promoted DDTREE; the near tie is recorded as a warning, not failed")


# ------------------------------------------------------------------ the weights

@pytest.mark.fault_case("weights: a file's checksum is wrong")
def test_corrupt_weights_fail_before_the_service_changes(ready):
    kg = labkit.known_good(HOST)
    svc = labkit.service(HOST)
    labkit.ssh(HOST, f"rm -rf {DRAFT_ROOT}")
    hits = mirror_fault_hits("corrupt")
    set_mirror_fault("corrupt")
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
    set_mirror_fault(None)
    assert run.rc == 2, str(run)
    text = flat(run)
    assert "failed before the service was changed" in text and "model.safetensors" in text, run.tail()
    assert re.search(r"checksum|sha256", text, re.I), run.tail()
    assert mirror_fault_hits("corrupt") - hits == 4, "expected the first try and 3 retries"
    assert labkit.ssh(HOST, f"test -e {DRAFT_ROOT}/{DRAFT_REV}", check=False).returncode != 0, \
        "unverified weights were moved into place"
    assert labkit.service(HOST)["ActiveEnterTimestamp"] == svc["ActiveEnterTimestamp"], "the service was restarted"
    ready("end_state", f"rc 2 before any change; 4 tries refused; {serving_known_good(HOST, kg)}")


@pytest.mark.fault_case("weights: the disk fills")
def test_full_disk_fails_before_the_service_changes(ready):
    kg = labkit.known_good(HOST)
    svc = labkit.service(HOST)
    labkit.ssh(HOST, f"rm -rf {DRAFT_ROOT} && mkdir -p {DRAFT_ROOT} && mount -t tmpfs -o size=128k tmpfs {DRAFT_ROOT}")
    try:
        # The declared size (4 GiB) does not fit: preflight's disk budget refuses, naming the filesystem.
        early = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
        # A declared size that understates the files gets past preflight; the download's own check stops it.
        small = {"repo_id": "z-lab/Qwen3.6-27B-DFlash", "revision": DRAFT_REV, "weights_gib": 0.0001}
        run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST, "-e", json.dumps(
            {"sglang_draft_model": small, "sglang_disk_headroom_gib": 0}))
    finally:
        labkit.ssh(HOST, f"umount {DRAFT_ROOT}")
    assert early.rc == 2, str(early)
    assert re.search(rf"not enough disk for the change: {DRAFT_ROOT} has 0\.0 GiB free, needs 5\.0 GiB: "
                     r"draft weights 4\.0 GiB \(sglang_draft_model\.weights_gib\)", flat(early)), early.tail()
    assert run.rc == 2, str(run)
    text = flat(run)
    assert "failed before the service was changed" in text, run.tail()
    assert re.search(r"no space left for z-lab/Qwen3.6-27B-DFlash@\w+: \d+ bytes free", text), run.tail()
    assert labkit.service(HOST)["ActiveEnterTimestamp"] == svc["ActiveEnterTimestamp"], "the service was restarted"
    ready("end_state", f"rc 2 before any change (no space, named); {serving_known_good(HOST, kg)}")


# ------------------------------------------------------------------ the known-good record itself

def _damage_and_refuse(ready, damage: str, repair: str, expect: str, label: str):
    kg = labkit.known_good(HOST)
    labkit.ssh(HOST, damage)
    try:
        snap = labkit.snapshot(HOST)
        run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
        after = labkit.snapshot(HOST)
    finally:
        labkit.ssh(HOST, repair)
    assert run.rc == 2, str(run)
    assert expect in flat(run), run.tail()
    assert "refusing to change the host" in flat(run).lower(), run.tail()
    assert snap == after, "the host changed:\n" + labkit.snapshot_diff(snap, after)
    ready("end_state", f"rc 2, refused ({label}), host byte-for-byte unchanged; {serving_known_good(HOST, kg)}")


@pytest.mark.fault_case("known-good record corrupted")
def test_corrupted_known_good_refuses_the_change(ready):
    kg_unit = f"{labkit.STATE_DIR}/known-good/unit"
    _damage_and_refuse(ready, f"cp -p {kg_unit} /root/kg-unit.bak && echo '# tampered' >> {kg_unit}",
                       f"cp -p /root/kg-unit.bak {kg_unit}", "does not match its checksums", "checksum mismatch")


@pytest.mark.fault_case("known-good record missing (dangling link)")
def test_missing_known_good_record_refuses_the_change(ready):
    target = labkit.known_good(HOST)["link"]
    _damage_and_refuse(ready, f"mv {labkit.STATE_DIR}/{target} /root/kg-record.bak",
                       f"mv /root/kg-record.bak {labkit.STATE_DIR}/{target}",
                       "which does not hold a record", "dangling link")


@pytest.mark.fault_case("known-good link missing")
def test_missing_known_good_link_refuses_the_change(ready):
    target = labkit.known_good(HOST)["link"]
    _damage_and_refuse(ready, f"rm {labkit.STATE_DIR}/known-good",
                       f"ln -sfn {target} {labkit.STATE_DIR}/known-good",
                       "record(s) in", "link missing, records exist")


# ------------------------------------------------------------------ the restored known-good fails too

@pytest.mark.fault_case("restored known-good fails its probe")
def test_restored_known_good_that_fails_is_loud_and_not_retried(ready):
    host = "ct129"   # DDTREE fails its gate on ct129 by itself; the fault hits only the restored NEXTN
    kg = labkit.known_good(host)
    before = labkit.evidence_dirs(host)
    since = int(time.time())
    set_fault(host, "garbage_fast", only="NEXTN")   # the running NEXTN started without it: baseline passes
    try:
        run = labkit.run_playbook("deploy_ddtree.yml", "-l", host)
    finally:
        clear_fault(host)
    assert run.rc == 2, str(run)
    text = flat(run)
    assert f"{host}: RESTORED KNOWN-GOOD {kg['meta']['fingerprint']} IS NOT SERVING CORRECTLY" in text, run.tail()
    assert "No further rollback is attempted" in text and "Needs an operator now" in text
    evidence = labkit.new_evidence_dir(host, before)
    restored = json.loads((evidence / "restored-probe-report.json").read_text())
    assert restored["verdict"] == "fail", restored
    starts = labkit.ssh(host, f"journalctl -u sglang.service --since @{since} -o cat --no-pager | grep -c '^Started ' || true").stdout
    assert int(starts.strip()) == 2, f"expected 2 starts (candidate, restore), no loop; got {starts.strip()}"
    live = labkit.sha256(host, labkit.UNIT, labkit.ENV_FILE)
    assert live[labkit.UNIT] == kg["unit_sha256"], "the known-good unit is not in place"
    assert labkit.known_good(host)["link"] == kg["link"]
    labkit.ssh(host, "systemctl restart sglang.service")   # the operator's fix: the fault is gone
    state = serving_restored(host, kg)
    ready("end_state", f"rc 2, loud failure, 2 starts (no loop), evidence {evidence.name}; after the fix: {state}")


# ------------------------------------------------------------------ the controller loses the host mid-change

def _lose_host_mid_change(cut, restore_link=None, timeout: float = 300):
    """Start a deploy, wait for the candidate to run, then cut() -- returns (run, seconds to restored)."""
    kg = labkit.known_good(HOST)
    dirs = watchdog_dirs(HOST)
    bg = labkit.Background("deploy_ddtree.yml", "-l", HOST, *WATCHDOG)
    try:
        labkit.wait_until(lambda: bg.proc.poll() is not None or candidate_running(HOST), 240, 0.3,
                          what="the DDTREE candidate running")
        assert bg.proc.poll() is None, f"the deploy ended before its candidate ran: {bg.wait()}"
        t_cut = time.monotonic()
        cut(bg)
        run = bg.wait(timeout)
    finally:
        if bg.proc.poll() is None:
            bg.proc.kill()
        if restore_link:
            restore_link()
    state = serving_restored(HOST, kg)
    restored_after = time.monotonic() - t_cut
    evidence, trigger = host_evidence(HOST, dirs)
    return run, restored_after, state, evidence, trigger


@pytest.mark.fault_case("SSH drops during the change")
def test_ssh_drop_mid_change_restores_known_good(ready):
    link = veth_host(HOST)
    run, took, state, evidence, trigger = _lose_host_mid_change(
        lambda bg: subprocess.run(["ip", "link", "set", link, "down"], check=True),
        restore_link=lambda: subprocess.run(["ip", "link", "set", link, "up"], check=True))
    assert run.rc == 4 and "UNREACHABLE" in run.out, str(run)
    assert trigger == "timer"
    ready("end_state", f"rc 4 unreachable; watchdog restored in {took:.0f}s; {state}; host evidence {evidence}")


def _ctrl_c(bg: labkit.Background, presses: int = 5) -> None:
    """Ctrl-C as an operator presses it: once, and again while the run neither stops nor says it was
    interrupted. ansible-playbook loses a SIGINT that lands while it forks a worker (its handler's
    KeyboardInterrupt is raised inside an at-fork hook: "Exception ignored in ... KeyboardInterrupt")
    and the run goes on; its handler then is SIG_DFL, so a second press ends the run."""
    for _ in range(presses):
        bg.proc.send_signal(signal.SIGINT)
        try:
            labkit.wait_until(lambda: bg.proc.poll() is not None or bg.saw("User interrupted execution"), 5, 0.2,
                              what="the run to stop")
            return
        except AssertionError:
            continue
    raise AssertionError(f"ansible-playbook ignored {presses} Ctrl-C presses")


@pytest.mark.fault_case("controller interrupted (Ctrl-C)")
def test_controller_interrupt_mid_change_restores_known_good(ready):
    run, took, state, evidence, trigger = _lose_host_mid_change(_ctrl_c)
    assert run.rc != 0, str(run)
    assert trigger == "timer"
    ready("end_state", f"rc {run.rc} interrupted; watchdog restored in {took:.0f}s; {state}; host evidence {evidence}")


@pytest.mark.fault_case("host reboots during the change")
def test_reboot_mid_change_restores_known_good_at_boot(ready):
    def reboot(bg):
        subprocess.run(labkit.labctl_argv("restart", labkit.machine(HOST)), check=True, timeout=180)
    run, took, state, evidence, trigger = _lose_host_mid_change(reboot)
    assert run.rc == 4 and "UNREACHABLE" in run.out, str(run)
    assert trigger == "boot", "the boot-time guard should have restored known-good"
    marker = labkit.ssh(HOST, f"test -e {labkit.STATE_DIR}/change-in-flight.json", check=False)
    assert marker.returncode != 0, "the in-flight marker survived the restore"
    ready("end_state", f"rc 4; boot guard restored in {took:.0f}s after the power cycle; {state}; host evidence {evidence}")


# ------------------------------------------------------------------ last: a transient cut recovers

@pytest.mark.fault_case("weights: download cut mid-file (once)")
def test_download_cut_once_is_retried_and_the_change_goes_on(ready):
    labkit.ssh(HOST, f"rm -rf {DRAFT_ROOT}")
    hits = mirror_fault_hits("cut")
    set_mirror_fault("cut", times=1)
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST)
    set_mirror_fault(None)
    assert run.rc == 0, str(run)
    assert mirror_fault_hits("cut") - hits == 1
    marker = labkit.read_json(HOST, f"{DRAFT_ROOT}/{DRAFT_REV}/.ddtree-verified.json")
    assert marker["revision"] == DRAFT_REV
    kg = labkit.known_good(HOST)
    assert kg["meta"]["algorithm"] == "DDTREE", kg   # promoted through the gate
    ready("end_state", f"rc 0; the retry fetched it; {serving_known_good(HOST, kg)} (module end reseeds NEXTN)")
