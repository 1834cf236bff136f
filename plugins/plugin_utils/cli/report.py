"""ddtree-report: merge the reports of a sliced run into the fleet report.

  ddtree-report merge [--out FLEET.json] [--textfile FLEET.prom] REPORT.json|DIR ...

A run cut into N slices (AWX job slicing, or N runs with -l and -e ddtree_slice=K/N) writes one
report per slice: <run>.slice-K-of-N.json, latest.slice-K-of-N.json and, for drift runs,
ddtree_fleet_drift.slice-K-of-N.prom. Give the slices' JSON reports (a directory stands for its
latest.slice-*.json); the merged report (JSON) goes to --out or stdout, and --textfile writes
the Prometheus textfile of the whole fleet (atomically), as an unsliced run would have.

Exit 0 = merged; 1 = the reports do not make one run (a slice missing or doubled, a host in two
slices, kinds mixed: the message says which); 2 = bad usage or unreadable input.
"""

import argparse
import glob
import json
import os
import sys
import tempfile


from ansible_collections.ddtree.fleet.plugins.module_utils import report as ddtree_report


def _paths(args):
    out = []
    for item in args:
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(glob.escape(item), "latest.slice-*.json")))
            if not found:
                raise OSError("%s holds no latest.slice-*.json" % item)
            out.extend(found)
        else:
            out.append(item)
    return out


def _write(path, text):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ddtree-report.", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="ddtree-report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="merge the slices' reports of one run")
    merge.add_argument("reports", nargs="+", help="slice reports (JSON), or directories of latest.slice-*.json")
    merge.add_argument("--out", help="write the merged JSON report here (default: stdout)")
    merge.add_argument("--textfile", help="write the fleet's Prometheus textfile here (drift runs)")
    args = parser.parse_args(argv)
    try:
        reports = []
        for path in _paths(args.reports):
            with open(path, encoding="utf-8") as handle:
                reports.append(json.load(handle))
    except (OSError, ValueError) as exc:
        print("ddtree-report: %s" % exc, file=sys.stderr)
        return 2
    try:
        merged = ddtree_report.merge(reports)
    except ddtree_report.ReportError as exc:
        print("ddtree-report: cannot merge: %s" % exc, file=sys.stderr)
        return 1
    text = json.dumps(merged, indent=2, sort_keys=True) + "\n"
    if args.out:
        _write(args.out, text)
    else:
        sys.stdout.write(text)
    if args.textfile:
        finished = ddtree_report.iso_seconds(merged["finished"]) if merged["finished"] else 0
        _write(args.textfile, ddtree_report.textfile(merged["hosts"], finished))
    print("ddtree-report: %d hosts from %d slices" % (len(merged["hosts"]), len(merged["slices"])), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
