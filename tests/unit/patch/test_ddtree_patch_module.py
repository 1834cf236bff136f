"""plugins/modules/sglang_patch.py in-process (patch_module_args, exit/fail patched to raise)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from patchset_testlib import ALGO_V0, ALGO_V2, UTILS_V0, load_library


class ModuleDone(Exception):
    def __init__(self, result):
        super().__init__(result.get("msg", ""))
        self.result = result


@pytest.fixture
def run(monkeypatch):
    def exit_json(self, **kwargs):
        kwargs.setdefault("changed", False)
        raise ModuleDone(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(msg=msg, failed=True)
        raise ModuleDone(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    module = load_library("sglang_patch")

    def _run(args, check_mode=False, diff=False):
        args = dict(args)
        if check_mode:
            args["_ansible_check_mode"] = True
        if diff:
            args["_ansible_diff"] = True
        with patch_module_args(args):
            with pytest.raises(ModuleDone) as info:
                module.main()
        return info.value.result

    return _run


def base_args(tree, **extra):
    args = {"site_packages": str(tree.site), "patches": tree.patches, "checksums": tree.checksums()}
    args.update(extra)
    return args


def test_module_applies_then_is_idempotent(run, tree):
    result = run(base_args(tree, expect={"sglang/srt/algo.py": ['"DDTREE"']}))
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert result["applied"] == ["0001-register.patch", "0002-family.patch"]
    assert result["files"] == ["sglang/srt/algo.py", "sglang/srt/utils.py"]
    assert result["patch_version"].startswith("GNU patch")
    assert result["stamp"]["fingerprint"] == result["fingerprint"]
    assert json.loads((tree.site / "sglang" / ".ddtree-patchset.json").read_text()) == result["stamp"]
    assert "diff" not in result
    assert tree.algo.read_text() == ALGO_V2

    again = run(base_args(tree))
    assert again["changed"] is False
    assert again["applied"] == []
    assert again["already_applied"] == ["0001-register.patch", "0002-family.patch"]


def test_module_check_mode_and_diff(run, tree):
    before = tree.snapshot()
    result = run(base_args(tree), check_mode=True, diff=True)
    assert result["changed"] is True
    assert result["applied"] == ["0001-register.patch", "0002-family.patch"]
    assert tree.snapshot() == before
    diffs = result["diff"]
    assert [d["after_header"].rsplit("with ", 1)[1].rstrip(")") for d in diffs] == result["applied"]
    assert "+++ b/sglang/srt/utils.py" in diffs[1]["prepared"]
    assert diffs[0]["before_header"].endswith("(without 0001-register.patch)")


def test_module_checksum_mismatch_fails_untouched(run, tree):
    args = base_args(tree)
    args["checksums"]["0001-register.patch"] = "f" * 64
    result = run(args)
    assert result["failed"] is True
    assert "0001-register.patch: sha256 is" in result["msg"]
    assert tree.algo.read_text() == ALGO_V0


def test_module_conflict_names_patch_and_output(run, tree):
    tree.utils.write_text(UTILS_V0.replace("return True", "return 1"))
    result = run(base_args(tree))
    assert result["failed"] is True
    assert result["failed_patch"] == "0002-family.patch"
    assert "utils.py" in result["patch_output"]
    assert tree.algo.read_text() == ALGO_V0


def test_module_missing_marker_reports_problems(run, tree):
    result = run(base_args(tree, expect={"sglang/srt/algo.py": ["NOT THERE"]}))
    assert result["failed"] is True
    assert result["problems"] == ["sglang/srt/algo.py: expected marker 'NOT THERE' not found"]
    assert tree.algo.read_text() == ALGO_V0


def test_module_rejects_bad_expect_and_missing_patch_binary(run, tree):
    result = run(base_args(tree, expect={"sglang/srt/algo.py": [1, 2]}))
    assert result["failed"] is True and "list of strings" in result["msg"]
    result = run(base_args(tree, patch_executable=str(tree.root / "no-such-patch")))
    assert result["failed"] is True and "cannot run" in result["msg"]
