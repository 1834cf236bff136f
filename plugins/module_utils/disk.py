# -*- coding: utf-8 -*-
# ddtree-fleet: the disk budget of a change - everything it writes, per filesystem.
#
# Used by preflight (filter ddtree.fleet.disk_budget) and by the unit tests; pure logic. A change
# may write the target weights, the draft weights and a new venv, each only when it is not on the
# host yet, and each on the filesystem that holds its path (models and venvs may live apart).
# Every filesystem written to must keep the headroom free afterwards.

from __future__ import annotations

GIB = 1024 ** 3


def disk_budget(items, headroom_gib):
    """items: [{name, var, gib, present, mount, free_bytes}] -> {fits, filesystems, message}.

    A present item needs nothing. Each filesystem that receives something needs the sum of its
    items plus ``headroom_gib``; ``message`` names every filesystem that lacks space with what it
    would receive and the variables that size it."""
    headroom = float(headroom_gib)
    if headroom < 0:
        raise ValueError("headroom_gib must be >= 0, got %r" % (headroom_gib,))
    by_mount = {}
    for item in items:
        gib = float(item["gib"])
        if gib < 0:
            raise ValueError("%s: %s must be >= 0, got %r" % (item["name"], item["var"], item["gib"]))
        fs = by_mount.setdefault(item["mount"], {"mount": item["mount"], "free_gib": int(item["free_bytes"]) / GIB,
                                                 "need_gib": 0.0, "items": []})
        if not item.get("present"):
            fs["need_gib"] += gib
            fs["items"].append(item)
    out, short = [], []
    for fs in by_mount.values():
        if fs["items"]:
            fs["need_gib"] += headroom
        fs["fits"] = fs["free_gib"] + 1e-9 >= fs["need_gib"]
        out.append({"mount": fs["mount"], "free_gib": round(fs["free_gib"], 2), "need_gib": round(fs["need_gib"], 2),
                    "fits": fs["fits"], "items": [i["name"] for i in fs["items"]]})
        if not fs["fits"]:
            short.append("%s has %.1f GiB free, needs %.1f GiB: %s + %.1f GiB headroom (sglang_disk_headroom_gib)" % (
                fs["mount"], fs["free_gib"], fs["need_gib"],
                " + ".join("%s %.1f GiB (%s)" % (i["name"], float(i["gib"]), i["var"]) for i in fs["items"]),
                headroom))
    return {"fits": not short, "filesystems": out, "message": "; ".join(short)}
