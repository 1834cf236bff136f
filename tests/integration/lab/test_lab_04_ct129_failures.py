"""Three more ways DDTREE fails on ct129, each caught and rolled back to the known-good NEXTN:

* upstream SGLang without the patch set: start-up aborts (unknown algorithm);
* half the patch set: its first generation kills it (feature dim mismatch). That is the
  server's own warm-up request, so it never becomes healthy, as sglang 0.5.23 behaves;
* mem_fraction_static 0.95 on 48 GB cards: out of memory before healthy.

The first two build their own venv (a pip install of the sglang wheel from the lab mirror).
"""

from __future__ import annotations

import json

import labkit
import pytest

HOST = "ct129"
PATCH_1 = "0001-ddtree-register-algorithm.patch"

# The unpatched and half-patched sources do not define --speculative-ddtree-budget: the sglang
# role would refuse sm86's budget up front for them, so these replays leave it out (as the
# incident's units did) to reach the server's own failure.
CASES = {
    "unpatched": (["-e", '{"sglang_patches": [], "sglang_ddtree_budget": 0}'],
                  "Unknown speculative algorithm name: DDTREE", True),
    "half_patched": (["-e", json.dumps({"sglang_patches": [PATCH_1], "sglang_ddtree_budget": 0})],
                     "feature dim mismatch", True),
    "mem_fraction_0.95": (["-e", "sglang_mem_fraction_static=0.95"], "CUDA out of memory", False),
}


@pytest.fixture(scope="module", autouse=True)
def clear_quarantine_after(lab):
    yield
    labkit.clear_quarantine(HOST)


@pytest.mark.parametrize("case", list(CASES))
def test_failed_ddtree_variant_is_rolled_back(lab, case):
    extra, error, own_venv = CASES[case]
    kg = labkit.known_good(HOST)
    assert kg["meta"]["algorithm"] == "NEXTN", kg
    live_before = labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE)
    before_dirs = labkit.evidence_dirs(HOST)

    run = labkit.run_playbook("deploy_ddtree.yml", "-l", HOST, *extra)
    print(f"\n[failure] {case}: rc {run.rc} in {run.seconds:.1f}s")
    assert run.rc != 0, str(run)
    recap = run.recap(HOST)
    assert recap["failed"] == 1 and recap["rescued"] == 1, recap
    assert "ct129: the DDTREE change failed" in " ".join(run.out.split()), run.tail()

    evidence = labkit.new_evidence_dir(HOST, before_dirs)
    journal = (evidence / "journal.txt").read_text()
    assert error in journal, f"{error!r} not in {evidence}/journal.txt:\n{journal[-3000:]}"
    summary = json.loads((evidence / "summary.json").read_text())
    assert summary["host"] == HOST and summary["algorithm"] == "DDTREE", summary
    venv = json.loads((evidence / "flags.json").read_text())["venv"]
    assert (venv != kg["meta"]["venv"]) == own_venv, (venv, kg["meta"]["venv"])
    if own_venv:
        stamp = labkit.read_json(HOST, f"{venv}/.ddtree-venv.json")
        assert [p["name"] for p in stamp["patches"]] == (
            [] if case == "unpatched" else [PATCH_1]), stamp

    # Restored: the known-good bytes, active, and serving correctly.
    assert labkit.sha256(HOST, labkit.UNIT, labkit.ENV_FILE) == live_before
    assert live_before[labkit.UNIT] == kg["unit_sha256"]
    assert labkit.known_good(HOST)["link"] == kg["link"]
    svc = labkit.service(HOST)
    assert svc["ActiveState"] == "active", svc
    restored = json.loads((evidence / "restored-probe-report.json").read_text())
    assert restored["verdict"] == "pass", restored.get("reasons")
    rc, report, err = labkit.probe(HOST)
    assert rc == 0 and report["verdict"] == "pass", (rc, report and report.get("reasons"), err)

    assert f"{summary['fingerprint']}.json" in labkit.quarantine_files(HOST)
    labkit.record_timing(f"ct129 {case}", play_wall=float(run.seconds))
