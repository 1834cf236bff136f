#!/usr/bin/env python3
"""Run ddtree_textcheck.assess over the labelled corpus and print recall and false alarms.

    .venv/bin/python tests/bench/textcheck_corpus.py [--stdlib-only] [--corpus PATH]
                                                     [--ids-prefix PREFIX | --not-ids-prefix PREFIX]

Controller mode (default) uses the optional library judges when installed; with
--stdlib-only the host's standard-library path is measured.  Exit status 1 when
recall (on records not moved in from the held-out split) is below 95 % or any good
output is flagged (controller mode only; the
host path is reported, not gated).
"""

import argparse
import collections
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))

from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck import judge as textcheck  # noqa: E402

CORPUS = os.path.join(ROOT, "tests", "data", "textcheck_corpus.jsonl")
MIN_RECALL = 95.0


def load(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def run(records):
    rows = []
    for rec in records:
        verdict, reasons = textcheck.assess(rec["output"], prompt=rec.get("prompt"),
                                            output_ids=rec.get("output_ids"))
        rows.append((rec, verdict == "degenerate", reasons))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stdlib-only", action="store_true",
                    help="measure the host path (no library judges)")
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--ids-prefix", help="judge only records whose id starts with this")
    ap.add_argument("--not-ids-prefix", help="judge only records whose id does not start with this")
    args = ap.parse_args(argv)
    textcheck.use_libraries(not args.stdlib_only)
    records = load(args.corpus)
    if args.ids_prefix:
        records = [r for r in records if r["id"].startswith(args.ids_prefix)]
    if args.not_ids_prefix:
        records = [r for r in records if not r["id"].startswith(args.not_ids_prefix)]
    t0 = time.monotonic()
    rows = run(records)
    elapsed = time.monotonic() - t0

    stats = collections.OrderedDict()
    for rec, flagged, _ in sorted(rows, key=lambda r: (r[0]["label"], r[0]["kind"])):
        st = stats.setdefault((rec["label"], rec["kind"]), [0, 0])
        st[0] += 1
        st[1] += flagged
    print("judges: %s" % json.dumps(textcheck.judges(), sort_keys=True))
    print("%-11s %-22s %5s %8s %8s" % ("label", "kind", "count", "caught", "recall"))
    for (label, kind), (n, k) in stats.items():
        if label == "degenerate":
            print("%-11s %-22s %5d %8d %7.1f%%" % (label, kind, n, k, 100.0 * k / n))
        else:
            print("%-11s %-22s %5d %8s %8s" % (label, kind, n, "%d FA" % k, ""))
    bad = [r for r in rows if r[0]["label"] == "degenerate"]
    good = [r for r in rows if r[0]["label"] != "degenerate"]
    caught = sum(1 for r in bad if r[1])
    alarms = [r for r in good if r[1]]
    recall = 100.0 * caught / max(1, len(bad))
    print("total: degenerate %d caught %d (recall %.1f%%); good %d, false alarms %d"
          % (len(bad), caught, recall, len(good), len(alarms)))
    misses = [r for r in bad if not r[1]]
    if misses:
        print("\nmisses:")
        for rec, _, _ in misses:
            print("  %-22s %-18s %r" % (rec["id"], rec["kind"], rec["output"][:70]))
    if alarms:
        print("\nfalse alarms:")
        for rec, _, reasons in alarms:
            print("  %-22s %-18s %s" % (rec["id"], rec["kind"], "; ".join(reasons)[:160]))
    print("\n%d outputs judged in %.2f s (%s mode)" % (
        len(rows), elapsed, "stdlib-only" if args.stdlib_only else "controller"))
    # The gate: recall on the records collected for development (cases moved in from the
    # held-out split, note "moved from held-out", are the hard ones and reported apart).
    own = [r for r in bad if "moved from held-out" not in (r[0].get("note") or "")]
    own_recall = 100.0 * sum(1 for r in own if r[1]) / max(1, len(own))
    if len(own) != len(bad):
        print("recall without the %d moved held-out cases: %.1f%% (%d/%d)" % (
            len(bad) - len(own), own_recall, sum(1 for r in own if r[1]), len(own)))
    if not args.stdlib_only and (own_recall < MIN_RECALL or alarms):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
