#!/usr/bin/env python3
"""tune.yml's search against the exhaustive grid, on the lab physics (no servers).

For each lab architecture (sm120: ct200, 8 x RTX PRO 6000, tp 1; sm86: ct129, 2 x A6000, tp 2),
starting from the group's own values: the trials the search ran, its bound, the winner and its
noiseless score, the grid's best over the same space at the winner's memory fraction, and the
winner's gain over the known-good configuration with its interval. Repeats the search with
different noise seeds to show how often it lands within a few percent of the grid's best.

  .venv/bin/python tests/bench/tune_search.py [--seeds 20]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1].parent
for p in ("collections", "lab", "lab/standin/src"):
    sys.path.insert(0, str(REPO / p))

import yaml  # noqa: E402

import tune_physics  # noqa: E402
from ansible_collections.ddtree.fleet.plugins.module_utils import tune  # noqa: E402

KNOWN_GOOD = {"sm120": None, "sm86": "NEXTN"}   # ct129's known-good: DDTREE fails on sm86


def group_vars(arch: str) -> dict:
    gv = yaml.safe_load((REPO / "group_vars" / "all.yml").read_text())
    gv.update(yaml.safe_load((REPO / "group_vars" / f"{arch}.yml").read_text()) or {})
    if KNOWN_GOOD[arch]:
        gv["sglang_speculative_algorithm"] = KNOWN_GOOD[arch]
    return gv


def run(arch: str, settings: tune.Settings, space: tune.Space, seed: str) -> dict:
    records = []

    def measure(config, fidelity):
        out = tune_physics.measure(arch, asdict(config), fidelity, settings.concurrency,
                                    rounds=settings.rounds(fidelity), seed=seed)
        rec = tune.trial_record(config, fidelity, out["status"], out["levels"], out["stage"], out["reason"])
        records.append(rec)
        return rec
    gv = group_vars(arch)
    res = tune.search(space, gv, settings, measure)
    w = res["winner"]
    grid = [tune_physics.true_score(arch, asdict(c), settings.latency_bound_ms, settings.concurrency)
            for c in space.grid(w.mem_fraction_static)]
    best = max(v for v in grid if v is not None)
    found = tune_physics.true_score(arch, asdict(w), settings.latency_bound_ms, settings.concurrency)
    g = tune.gain(records, w, res["current"], settings)
    return {"arch": arch, "trials": len(res["trials"]), "failed": sum(r["status"] != "ok" for r in records),
            "grid": len(grid), "winner": w.key, "found": found, "best": best, "gain": g,
            "recommend": tune.recommend(gv, w, res["current"], g)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args(argv)
    settings, space = tune.Settings(), tune.Space()
    print(f"bound on trials: {tune.trial_bound(space, settings)} (tune_max_trials={settings.max_trials}); "
          f"score: best tokens/s with {settings.latency_metric} <= {settings.latency_bound_ms} ms at "
          f"concurrency {list(settings.concurrency)}\n")
    print("| arch | trials (failed) | grid | share | winner | its score | grid best | within | gain over known-good |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---|")
    for arch in ("sm120", "sm86"):
        r = run(arch, settings, space, seed="0")
        g = r["gain"]
        print(f"| {arch} | {r['trials']} ({r['failed']}) | {r['grid']} | {r['trials'] / r['grid']:.0%} | "
              f"`{r['winner']}` | {r['found']:.1f} | {r['best']:.1f} | {r['found'] / r['best']:.1%} | "
              f"x{g['ratio']:.3f} [{g['low']:.3f}, {g['high']:.3f}] at c={g['concurrency']}: "
              f"{'propose' if r['recommend']['propose'] else 'keep'} |")
    print()
    for arch in ("sm120", "sm86"):
        runs = [run(arch, settings, space, seed=str(s)) for s in range(args.seeds)]
        within = [r["found"] / r["best"] for r in runs]
        trials = [r["trials"] for r in runs]
        print(f"{arch}: {args.seeds} noise seeds: within {min(within):.1%}..{max(within):.1%} of the grid's best "
              f"({sum(w >= 0.97 for w in within)}/{len(within)} within 3 %), trials {min(trials)}..{max(trials)} "
              f"of a {runs[0]['grid']}-configuration grid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
