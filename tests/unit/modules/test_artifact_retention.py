"""The controller's artifacts (plugins/module_utils/retention.py controller_plan, module
artifact_retention): old run reports and old evidence go; latest*.json, protected evidence, other
hosts' evidence and everything else under artifacts/ stay."""
from __future__ import annotations

import os

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils import retention


@pytest.fixture
def artifacts(tmp_path):
    root = tmp_path / "artifacts"
    clock = [1_000_000]

    def make(path, is_dir=False):
        path.parent.mkdir(parents=True, exist_ok=True)
        if is_dir:
            path.mkdir()
            (path / "summary.json").write_text("{}")
        else:
            path.write_text("{}")
        clock[0] += 100
        os.utime(path, (clock[0], clock[0]))
        return path

    for i in range(5):
        make(root / "deploy" / f"2026120{i}T000000Z-1.json")
        make(root / "drift" / f"2026120{i}T000000Z-2.json")
    make(root / "drift" / "20261205T000000Z-3.slice-1-of-2.json")
    make(root / "deploy" / "latest.json")
    make(root / "drift" / "latest.slice-1-of-2.json")
    make(root / "drift" / "ddtree_fleet_drift.prom")
    for host in ("ct129", "ct200"):
        for i in range(4):
            make(root / host / f"2026120{i}T000000Z", is_dir=True)
    make(root / "logs" / "slot0" / "run.log")
    return root


def _names(paths):
    return sorted(os.path.relpath(p, start=os.path.dirname(os.path.dirname(p))) for p in paths)


def test_plan_keeps_the_newest_latest_and_the_protected(artifacts):
    protected = [str(artifacts / "ct129" / "20261200T000000Z")]      # the oldest, named by a quarantine
    planned = retention.controller_plan(str(artifacts), ["ct129"], protected, keep_runs=2, keep_evidence=1)
    assert _names(planned["reports"]["removed"]) == [
        "deploy/20261200T000000Z-1.json", "deploy/20261201T000000Z-1.json", "deploy/20261202T000000Z-1.json",
        "drift/20261200T000000Z-2.json", "drift/20261201T000000Z-2.json", "drift/20261202T000000Z-2.json",
        "drift/20261203T000000Z-2.json"]
    assert "deploy/latest.json" not in _names(planned["reports"]["kept"])        # never even considered
    assert _names(planned["evidence"]["kept"]) == ["ct129/20261200T000000Z", "ct129/20261203T000000Z"]
    assert _names(planned["evidence"]["removed"]) == ["ct129/20261201T000000Z", "ct129/20261202T000000Z"]


def test_module_collects_then_has_nothing_to_do_and_check_mode_removes_nothing(run_module, artifacts):
    params = {"artifacts_dir": str(artifacts), "hosts": ["ct129", "ct200"], "protected": [],
              "keep_runs": 1, "keep_evidence": 2}
    dry = run_module("artifact_retention", params, check_mode=True)
    assert dry.result["changed"] and len(dry.result["removed"]["reports"]) == 9
    assert len(os.listdir(artifacts / "deploy")) == 6 and dry.result["freed_bytes"] > 0
    done = run_module("artifact_retention", dict(params, _ansible_diff=True))
    assert done.result["changed"] and done.result["freed_bytes"] == dry.result["freed_bytes"]
    assert sorted(os.listdir(artifacts / "deploy")) == ["20261204T000000Z-1.json", "latest.json"]
    assert sorted(os.listdir(artifacts / "drift")) == ["20261205T000000Z-3.slice-1-of-2.json",
                                                       "ddtree_fleet_drift.prom", "latest.slice-1-of-2.json"]
    assert sorted(os.listdir(artifacts / "ct200")) == ["20261202T000000Z", "20261203T000000Z"]
    assert (artifacts / "logs" / "slot0" / "run.log").exists()
    assert str(artifacts / "ct129" / "20261200T000000Z") + "\n" in done.result["diff"]["before"]
    again = run_module("artifact_retention", params)
    assert not again.result["changed"] and again.result["freed_bytes"] == 0


def test_only_the_targeted_hosts_evidence_is_touched(run_module, artifacts):
    res = run_module("artifact_retention", {"artifacts_dir": str(artifacts), "hosts": ["ct200", "logs", "../x"],
                                            "keep_runs": 100, "keep_evidence": 1})
    assert len(os.listdir(artifacts / "ct129")) == 4 and len(os.listdir(artifacts / "ct200")) == 1
    assert (artifacts / "logs" / "slot0").exists() and not res.result["removed"]["reports"]


def test_bad_keep_is_refused(run_module, artifacts):
    res = run_module("artifact_retention", {"artifacts_dir": str(artifacts), "keep_runs": -1})
    assert res.failed and "keep_runs=-1: expected 0 or more" in res.result["msg"]


def test_the_action_plugin_collects_in_process_and_check_mode_removes_nothing(artifacts, tmp_path):
    """The role's task runs the action plugin (plugins/action/artifact_retention.py): no module run."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ddtree.fleet.artifact_retention: {artifacts_dir: '{{ dir }}', hosts: [ct129], keep_runs: 1, keep_evidence: 1}\n"
        "      register: r\n"
        "    - ddtree.fleet.controller_files: {dir: '{{ out }}', files: [{name: r.json, content: '{{ r | to_json }}'}]}\n"
        "      check_mode: false\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_HOME": str(tmp_path / ".ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1"}

    def play(*args):
        run = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
                              "-c", "local", "-e", json.dumps({"dir": str(artifacts), "out": str(tmp_path / "out")}), *args, str(tmp_path / "play.yml")],
                             cwd=repo, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        return json.loads((tmp_path / "out" / "r.json").read_text())

    before = sorted(os.listdir(artifacts / "ct129"))
    checked = play("--check")
    assert checked["changed"] and sorted(os.listdir(artifacts / "ct129")) == before
    done = play()
    assert done["changed"] and len(os.listdir(artifacts / "ct129")) == 1 and len(os.listdir(artifacts / "ct200")) == 4
    assert not play()["changed"]
