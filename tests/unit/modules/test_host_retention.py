"""What a host keeps of the past (plugins/module_utils/retention.py, plugins/modules/host_retention.py)."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils import retention


class Host:
    """A host's records, venvs, weights and patch sets under tmp_path, each with its own age."""

    def __init__(self, root):
        self.state = root / "state"
        self.venvs = root / "venvs"
        self.models = root / "models"
        self.patches = root / "patches"
        self.clock = 1_000_000

    def _dir(self, path, size=10):
        path.mkdir(parents=True)
        (path / "blob").write_bytes(b"x" * size)
        self.clock += 100
        os.utime(path, (self.clock, self.clock))
        return path

    def venv(self, name):
        patch_set = self.patches / name.rsplit("-", 1)[-1]
        if not patch_set.exists():
            self._dir(patch_set)
        return self._dir(self.venvs / name)

    def weights(self, repo, rev):
        return self._dir(self.models / repo / rev, size=1000)

    def record(self, fp, venv, model, draft=None):
        rec = self._dir(self.state / "records" / fp)
        (rec / "meta.json").write_text(json.dumps({"fingerprint": fp, "venv": str(venv), "model_dir": str(model),
                                                   "draft_dir": str(draft) if draft else ""}))
        os.utime(rec, (self.clock, self.clock))
        return rec

    def known_good(self, fp):
        link = self.state / "known-good"
        if link.is_symlink():
            link.unlink()
        link.symlink_to("records/" + fp)

    def plan(self, declared, keep):
        return retention.plan(str(self.state), str(self.venvs), str(self.models), str(self.patches), declared, keep)

    def params(self, declared, keep):
        return {"state_dir": str(self.state), "venv_root": str(self.venvs), "models_root": str(self.models),
                "patch_root": str(self.patches), "declared": declared, "keep": keep}


def names(paths):
    return sorted(os.path.basename(p) for p in paths)


@pytest.fixture
def host(tmp_path):
    """Five promotions, each with its own venv and target revision; the oldest record is known-good
    again (a rollback), and its venv and weights are the oldest of all."""
    h = Host(tmp_path)
    venvs = [h.venv("0.5.23-set%d" % i) for i in range(5)]
    revs = [h.weights("Qwen--Qwen3.6-27B", "rev%d" % i) for i in range(5)]
    draft = h.weights("z-lab--Draft", "d0")
    for i in range(5):
        h.record("fp%d" % i, venvs[i], revs[i], draft if i == 4 else None)
    h.known_good("fp0")
    return h


def test_keeps_known_good_the_declared_and_the_newest_others_with_what_they_name(host):
    declared = {"fingerprint": "fp9", "venv": str(host.venvs / "0.5.23-set4"),
                "weights": [str(host.models / "Qwen--Qwen3.6-27B" / "rev4")]}
    planned = host.plan(declared, keep=1)
    assert names(planned["records"]["kept"]) == ["fp0", "fp4"]            # known-good + newest other
    assert names(planned["records"]["removed"]) == ["fp1", "fp2", "fp3"]
    # fp0's venv and weights are the oldest, and stay: the known-good record names them; set4 and
    # rev4 are the declared ones and fp4's; set3 and rev3 are the one newest other each.
    assert names(planned["venvs"]["kept"]) == ["0.5.23-set0", "0.5.23-set3", "0.5.23-set4"]
    assert names(planned["weights"]["kept"]) == ["d0", "rev0", "rev3", "rev4"]
    assert names(planned["weights"]["removed"]) == ["rev1", "rev2"]
    assert names(planned["patches"]["kept"]) == ["set0", "set3", "set4"]
    assert names(planned["patches"]["removed"]) == ["set1", "set2"]


def test_keep_counts_besides_what_must_stay(host):
    declared = {"fingerprint": "fp3", "venv": str(host.venvs / "0.5.23-set3"), "weights": []}
    planned = host.plan(declared, keep=0)
    assert names(planned["records"]["kept"]) == ["fp0", "fp3"]
    assert names(planned["venvs"]["kept"]) == ["0.5.23-set0", "0.5.23-set3"]
    assert host.plan(declared, keep=10)["venvs"]["removed"] == []


def test_building_dirs_links_and_dot_dirs_are_never_touched(host):
    (host.venvs / "0.5.23-new.partial").mkdir()
    (host.venvs / ".cache").mkdir()
    (host.venvs / "alias").symlink_to(host.venvs / "0.5.23-set1")
    planned = host.plan({"fingerprint": "fp0", "venv": "", "weights": []}, keep=0)
    every = [p for kind in retention.KINDS for p in planned[kind]["removed"] + planned[kind]["kept"]]
    assert not [p for p in every if p.endswith((".partial", ".cache", "alias"))]


def test_module_removes_then_has_nothing_left_to_do_and_check_mode_removes_nothing(run_module, host):
    declared = {"fingerprint": "fp4", "venv": str(host.venvs / "0.5.23-set4"),
                "weights": [str(host.models / "Qwen--Qwen3.6-27B" / "rev4")]}
    dry = run_module("host_retention", host.params(declared, 0), check_mode=True)
    assert dry.result["changed"] and names(dry.result["removed"]["records"]) == ["fp1", "fp2", "fp3"]
    assert (host.state / "records" / "fp1").exists() and dry.result["freed_bytes"] > 0
    done = run_module("host_retention", dict(host.params(declared, 0), _ansible_diff=True))
    assert done.result["changed"] and done.result["freed_bytes"] == dry.result["freed_bytes"]
    assert str(host.venvs / "0.5.23-set2") + "\n" in done.result["diff"]["before"]
    assert sorted(os.listdir(host.state / "records")) == ["fp0", "fp4"]
    assert sorted(os.listdir(host.venvs)) == ["0.5.23-set0", "0.5.23-set4"]
    assert sorted(os.listdir(host.models / "Qwen--Qwen3.6-27B")) == ["rev0", "rev4"]
    assert sorted(os.listdir(host.patches)) == ["set0", "set4"]
    again = run_module("host_retention", host.params(declared, 0))
    assert not again.result["changed"] and again.result["freed_bytes"] == 0
    # the known-good link still resolves, with its venv and weights
    meta = json.loads((host.state / "known-good" / "meta.json").read_text())
    assert os.path.isdir(meta["venv"]) and os.path.isdir(meta["model_dir"])


def test_a_host_with_nothing_yet_is_fine(run_module, tmp_path):
    res = run_module("host_retention", Host(tmp_path).params({"fingerprint": "x", "venv": "/nope", "weights": []}, 2))
    assert not res.failed and not res.result["changed"]
    assert res.result["removed"] == {"records": [], "venvs": [], "weights": [], "patches": [], "evidence": []}


def test_the_newest_watchdog_evidence_stays(host):
    for i in range(4):
        host._dir(host.state / "evidence" / ("watchdog-2026120%dT000000Z" % i))
    planned = host.plan({"fingerprint": "fp0", "venv": "", "weights": []}, keep=2)
    assert names(planned["evidence"]["kept"]) == ["watchdog-20261202T000000Z", "watchdog-20261203T000000Z"]
    assert names(planned["evidence"]["removed"]) == ["watchdog-20261200T000000Z", "watchdog-20261201T000000Z"]


def test_a_locked_venv_keeps_its_patch_set(tmp_path):
    """A venv built from a hash lock is <source>-<patch set>-lock-<lock id> (role sglang): its patch
    set is read from its .ddtree-venv.json record, or from the name without the lock suffix."""
    host = Host(tmp_path)
    host._dir(host.patches / "setA")
    host._dir(host.patches / "setB")
    host._dir(host.patches / "setC")
    recorded = host._dir(host.venvs / "0.5.23-setA-lock-0123456789")
    (recorded / ".ddtree-venv.json").write_text(json.dumps({"patchset": "setA"}))
    host._dir(host.venvs / "0.5.23-setB-lock-abcdef0123")            # no record: the name says
    assert retention.patchset_of(str(recorded)) == "setA"
    assert retention.patchset_of(str(host.venvs / "0.5.23-setB-lock-abcdef0123")) == "setB"
    assert retention.patchset_of(str(host.venvs / "0.5.23-setC")) == "setC"
    planned = host.plan({"venv": str(host.venvs / "0.5.23-setA-lock-0123456789")}, keep=5)
    assert names(planned["patches"]["kept"]) == ["setA", "setB"]
    assert names(planned["patches"]["removed"]) == ["setC"]
