"""Preflight's disk budget (plugins/module_utils/disk.py): everything a change writes, per filesystem."""

from __future__ import annotations

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils.disk import GIB, disk_budget


def item(name, gib, mount, free_gib, present=False, var=None):
    return {"name": name, "var": var or name.replace(" ", "_"), "gib": gib, "present": present, "mount": mount,
            "free_bytes": int(free_gib * GIB)}


def test_target_draft_and_venv_all_count_with_one_headroom_per_filesystem():
    """60 GiB free held the target (54) + 5 headroom, which is all the old check counted; the draft
    (4) and a new venv (12) on the same filesystem do not fit."""
    items = [item("target weights", 54, "/", 60), item("draft weights", 4, "/", 60), item("venv", 12, "/", 60)]
    res = disk_budget(items, 5)
    assert not res["fits"]
    assert res["filesystems"] == [{"mount": "/", "free_gib": 60.0, "need_gib": 75.0, "fits": False,
                                   "items": ["target weights", "draft weights", "venv"]}]
    assert res["message"] == ("/ has 60.0 GiB free, needs 75.0 GiB: target weights 54.0 GiB (target_weights) + "
                              "draft weights 4.0 GiB (draft_weights) + venv 12.0 GiB (venv) + 5.0 GiB headroom "
                              "(sglang_disk_headroom_gib)")


def test_what_is_on_the_host_already_needs_nothing():
    items = [item("target weights", 54, "/", 20, present=True), item("draft weights", 4, "/", 20),
             item("venv", 12, "/", 20, present=True)]
    res = disk_budget(items, 5)
    assert res["fits"] and res["filesystems"][0]["need_gib"] == 9.0 and res["message"] == ""
    # nothing to write: no headroom demanded either
    assert disk_budget([item("venv", 12, "/", 0, present=True)], 5)["fits"]


def test_filesystems_are_budgeted_apart_and_each_short_one_is_named():
    items = [item("target weights", 54, "/srv/models", 100), item("draft weights", 4, "/srv/models", 100),
             item("venv", 12, "/opt", 10)]
    res = disk_budget(items, 5)
    assert [(fs["mount"], fs["need_gib"], fs["fits"]) for fs in res["filesystems"]] == [
        ("/srv/models", 63.0, True), ("/opt", 17.0, False)]
    assert res["message"].startswith("/opt has 10.0 GiB free, needs 17.0 GiB: venv 12.0 GiB")
    assert "/srv/models" not in res["message"]


def test_exactly_enough_fits():
    assert disk_budget([item("venv", 12, "/", 17)], 5)["fits"]


@pytest.mark.parametrize("items, headroom, words", [
    ([item("venv", -1, "/", 10)], 5, "venv: venv must be >= 0"),
    ([item("venv", 1, "/", 10)], -1, "headroom_gib must be >= 0"),
])
def test_nonsense_is_an_error(items, headroom, words):
    with pytest.raises(ValueError, match=words):
        disk_budget(items, headroom)
