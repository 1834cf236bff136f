"""ensure_patchset / plan / apply / rollback on small synthetic trees (real GNU patch)."""

from __future__ import annotations

import json

import pytest
from patchset_testlib import ALGO_V0, ALGO_V1, ALGO_V2, UTILS_V0, UTILS_V2, make_patch, sha256


def ensure(logic, tree, patches=None, **kwargs):
    patches = tree.patches if patches is None else patches
    return logic.ensure_patchset(str(tree.site), patches, tree.checksums(patches) if patches else {}, **kwargs)


def test_applies_in_order_and_writes_stamp(logic, tree):
    result = ensure(logic, tree)
    assert result["changed"] is True
    assert result["applied"] == ["0001-register.patch", "0002-family.patch"]
    assert result["already_applied"] == []
    assert result["files"] == ["sglang/srt/algo.py", "sglang/srt/utils.py"]
    assert tree.algo.read_text() == ALGO_V2
    assert tree.utils.read_text() == UTILS_V2
    assert tree.litter() == []

    stamp = json.loads((tree.site / "sglang" / ".ddtree-patchset.json").read_text())
    assert stamp == result["stamp"]
    assert stamp["patches"] == [
        {"name": "0001-register.patch", "sha256": sha256(tree.p1)},
        {"name": "0002-family.patch", "sha256": sha256(tree.p2)},
    ]
    assert stamp["fingerprint"] == result["fingerprint"] == logic.patchset_fingerprint(stamp["patches"])
    assert stamp["applied_at"].endswith("Z")
    assert result["stamp_path"] == str(tree.site / "sglang" / ".ddtree-patchset.json")


def test_second_run_changes_nothing(logic, tree):
    first = ensure(logic, tree)
    before = tree.snapshot()
    second = ensure(logic, tree)
    assert second["changed"] is False
    assert second["applied"] == [] and second["files"] == []
    assert second["already_applied"] == ["0001-register.patch", "0002-family.patch"]
    assert second["stamp"] == first["stamp"]
    assert tree.snapshot() == before


def test_half_patched_tree_gets_the_rest(logic, tree):
    first = ensure(logic, tree, patches=[str(tree.p1)])
    assert tree.algo.read_text() == ALGO_V1 and tree.utils.read_text() == UTILS_V0
    assert first["fingerprint"] != logic.patchset_fingerprint([])

    result = ensure(logic, tree)
    assert result["changed"] is True
    assert result["already_applied"] == ["0001-register.patch"]
    assert result["applied"] == ["0002-family.patch"]
    assert tree.algo.read_text() == ALGO_V2 and tree.utils.read_text() == UTILS_V2
    assert result["stamp"]["fingerprint"] == logic.patchset_fingerprint(
        [(p.name, sha256(p)) for p in (tree.p1, tree.p2)]
    )


def test_dependent_patches_are_judged_in_order(logic, tree):
    """0003 edits the line 0001 adds, so 0001 alone no longer reverses on the final tree."""
    algo_v3 = ALGO_V2.replace('    "DDTREE",\n', '    "DDTREE",  # tree verify\n')
    p3 = make_patch(tree.patch_dir, "0003-dependent.patch", {"sglang/srt/algo.py": (ALGO_V2, algo_v3)})
    patches = tree.patches + [str(p3)]
    assert ensure(logic, tree, patches=patches)["changed"] is True
    assert tree.algo.read_text() == algo_v3
    # 0001 judged on its own looks conflicting now; the planner peels 0003 first.
    state, _ = logic.patch_state("patch", str(tree.site), logic.load_patches([str(tree.p1)], tree.checksums())[0])
    assert state == "conflict"
    again = ensure(logic, tree, patches=patches)
    assert again["changed"] is False
    assert again["already_applied"] == ["0001-register.patch", "0002-family.patch", "0003-dependent.patch"]


def test_check_mode_reports_without_touching(logic, tree):
    before = tree.snapshot()
    result = ensure(logic, tree, check_mode=True)
    assert result["changed"] is True
    assert result["applied"] == ["0001-register.patch", "0002-family.patch"]
    assert result["stamp"]["fingerprint"] == result["fingerprint"]
    assert tree.snapshot() == before


def test_conflict_is_found_before_anything_changes(logic, tree):
    # Someone edited utils.py by hand: 0002 cannot apply, so 0001 must not be applied either.
    tree.utils.write_text(UTILS_V0.replace("# Relay hidden", "# hand edit: relay hidden"))
    before = tree.snapshot()
    with pytest.raises(logic.PatchConflictError) as info:
        ensure(logic, tree)
    assert info.value.patch == "0002-family.patch"
    assert "0002-family.patch" in str(info.value)
    assert "FAILED" in info.value.output or "failed" in info.value.output
    assert tree.snapshot() == before
    assert tree.litter() == []


def test_apply_rolls_back_what_this_run_applied(logic, tree):
    """The low-level applier: 0002 fails after 0001 went in -> 0001 is reversed again."""
    tree.utils.write_text("def need_hidden_states(name):\n    return True\n")
    before = tree.snapshot()
    patches = logic.load_patches(tree.patches, tree.checksums())
    with pytest.raises(logic.PatchConflictError) as info:
        logic.apply_patches("patch", str(tree.site), patches)
    assert info.value.patch == "0002-family.patch"
    assert info.value.rolled_back == ["0001-register.patch"]
    assert tree.snapshot() == before
    assert tree.litter() == []


def test_checksum_mismatch_refuses_before_any_change(logic, tree):
    sums = tree.checksums()
    sums["0002-family.patch"] = "0" * 64
    before = tree.snapshot()
    with pytest.raises(logic.ChecksumError, match="0002-family.patch: sha256 is"):
        logic.ensure_patchset(str(tree.site), tree.patches, sums)
    assert tree.snapshot() == before


def test_missing_checksum_refuses(logic, tree):
    sums = tree.checksums()
    del sums["0001-register.patch"]
    with pytest.raises(logic.ChecksumError, match="0001-register.patch: no checksum"):
        logic.ensure_patchset(str(tree.site), tree.patches, sums)
    assert tree.algo.read_text() == ALGO_V0


def test_tampered_patch_file_refuses(logic, tree):
    sums = tree.checksums()
    tree.p1.write_text(tree.p1.read_text().replace('"DDTREE"', '"DDTREE2"'))
    with pytest.raises(logic.ChecksumError, match="expected"):
        logic.ensure_patchset(str(tree.site), tree.patches, sums)
    assert tree.algo.read_text() == ALGO_V0


def test_expect_markers(logic, tree):
    ok = ensure(logic, tree, expect={"sglang/srt/algo.py": ['"DDTREE"'], "sglang/srt/utils.py": "DDTREE"})
    assert ok["changed"] is True


def test_missing_expect_marker_changes_nothing(logic, tree):
    before = tree.snapshot()
    with pytest.raises(logic.VerificationError) as info:
        ensure(logic, tree, expect={"sglang/srt/utils.py": ["is_ddtree"], "sglang/srt/nope.py": ["x"]})
    assert any("is_ddtree" in p for p in info.value.problems)
    assert any("nope.py" in p for p in info.value.problems)
    assert tree.snapshot() == before


def test_patch_that_breaks_syntax_is_refused(logic, tree):
    broken = make_patch(
        tree.patch_dir,
        "0001-broken.patch",
        {"sglang/srt/utils.py": (UTILS_V0, UTILS_V0.replace("return True", "return True)"))},
    )
    before = tree.snapshot()
    with pytest.raises(logic.VerificationError, match="does not compile"):
        ensure(logic, tree, patches=[str(broken)])
    assert tree.snapshot() == before


def test_verification_failure_after_apply_rolls_back(logic, tree, monkeypatch):
    """If the real tree fails verification after applying, this run's patches are reversed."""
    real_verify = logic.verify_tree
    calls = []

    def verify(roots, files, expect=None):
        calls.append(roots)
        if len(calls) == 2:  # the check on the real tree after applying
            return ["simulated: spec_info.py lost its marker"]
        return real_verify(roots, files, expect)

    monkeypatch.setattr(logic, "verify_tree", verify)
    before = tree.snapshot()
    with pytest.raises(logic.VerificationError) as info:
        ensure(logic, tree)
    assert info.value.rolled_back == ["0002-family.patch", "0001-register.patch"]
    assert tree.snapshot() == before


def test_lost_stamp_is_rewritten_without_reapplying(logic, tree):
    ensure(logic, tree)
    stamp = tree.site / "sglang" / ".ddtree-patchset.json"
    stamp.unlink()
    result = ensure(logic, tree)
    assert result["changed"] is True
    assert result["applied"] == []
    assert result["already_applied"] == ["0001-register.patch", "0002-family.patch"]
    assert json.loads(stamp.read_text())["fingerprint"] == result["fingerprint"]
    assert tree.algo.read_text() == ALGO_V2


def test_stamp_from_another_patch_set_is_refused(logic, tree):
    stamp = logic.make_stamp([{"name": "0009-other.patch", "sha256": "c" * 64}])
    logic.write_stamp(str(tree.site), stamp)
    with pytest.raises(logic.PatchSetError, match="different patch set"):
        ensure(logic, tree)
    assert tree.algo.read_text() == ALGO_V0


def test_empty_patch_set_has_a_stamp_too(logic, tree):
    result = logic.ensure_patchset(str(tree.site), [], {})
    assert result["changed"] is True
    assert result["fingerprint"] == "nopatch"
    assert result["stamp"]["patches"] == []
    assert logic.ensure_patchset(str(tree.site), [], {})["changed"] is False


def test_missing_package_dir_is_reported(logic, tmp_path, tree):
    empty = tmp_path / "empty-site"
    empty.mkdir()
    with pytest.raises(logic.PatchSetError, match="is the package installed"):
        logic.ensure_patchset(str(empty), tree.patches, tree.checksums())


def test_stamp_matches_rules(logic):
    entries = [{"name": "0001-x.patch", "sha256": "a" * 64}]
    stamp = logic.make_stamp(entries, applied_at="2026-01-01T00:00:00Z")
    assert logic.stamp_matches(stamp, entries)
    assert not logic.stamp_matches(stamp, [])
    assert not logic.stamp_matches(dict(stamp, fingerprint="0" * 12), entries)
    assert not logic.stamp_matches(None, entries)
    assert not logic.stamp_matches({"patches": "garbage"}, entries)


def test_gnu_patch_detected(logic):
    assert logic.check_gnu_patch("patch").startswith("GNU patch")
    with pytest.raises(logic.PatchSetError):
        logic.check_gnu_patch("/bin/true")


# ---- the no-op read: a stamp with the touched files' digests needs no GNU patch --------------


def test_stamp_records_the_touched_files_digests(logic, tree):
    result = ensure(logic, tree)
    files = result["stamp"]["files"]
    assert files == {"sglang/srt/algo.py": sha256(tree.algo), "sglang/srt/utils.py": sha256(tree.utils)}
    stamp = json.loads((tree.site / "sglang" / ".ddtree-patchset.json").read_text())
    assert stamp["files"] == files


def test_untouched_applied_set_is_read_without_gnu_patch(logic, tree):
    ensure(logic, tree)
    before = tree.snapshot()
    for check_mode in (True, False):
        result = ensure(logic, tree, check_mode=check_mode, patch_bin="/nonexistent/patch")
        assert result["changed"] is False and result["applied"] == [] and result["files"] == []
        assert result["already_applied"] == ["0001-register.patch", "0002-family.patch"]
    assert tree.snapshot() == before
    with pytest.raises(logic.PatchSetError, match="marker"):  # expectations are still checked
        ensure(logic, tree, expect={"sglang/srt/algo.py": ["marker that is not there"]}, patch_bin="/nonexistent/patch")


def test_a_hand_edited_patched_file_is_judged_by_gnu_patch_again(logic, tree):
    ensure(logic, tree)
    tree.algo.write_text(tree.algo.read_text() + "# edited by hand\n")
    assert logic.stamp_holds(logic.read_stamp(str(tree.site)), [p.entry() for p in logic.load_patches(
        [str(tree.p1), str(tree.p2)], tree.checksums(tree.patches))], str(tree.site),
        ["sglang/srt/algo.py", "sglang/srt/utils.py"]) is False
    with pytest.raises(FileNotFoundError):  # the fast path declined: the full plan needs GNU patch
        ensure(logic, tree, check_mode=True, patch_bin="/nonexistent/patch")
    result = ensure(logic, tree, check_mode=True)  # an appended comment: patch still finds the set applied
    assert result["already_applied"] == ["0001-register.patch", "0002-family.patch"]


def test_a_stamp_without_digests_takes_the_full_plan(logic, tree):
    ensure(logic, tree)
    path = tree.site / "sglang" / ".ddtree-patchset.json"
    old = json.loads(path.read_text())
    del old["files"]
    path.write_text(json.dumps(old))
    result = ensure(logic, tree, check_mode=True)
    assert result["changed"] is False
    assert result["already_applied"] == ["0001-register.patch", "0002-family.patch"]
    with pytest.raises(FileNotFoundError):
        ensure(logic, tree, check_mode=True, patch_bin="/nonexistent/patch")
