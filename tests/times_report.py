#!/usr/bin/env python3
"""The timing table of a test run: stage totals and the slowest tests.

tests/run_all.sh records each stage's start and end in artifacts/times/stages.tsv and has every
pytest run write artifacts/times/<stage>.json (tests/conftest.py, --times-json). This prints

  * the stage totals (wall seconds; a stage whose tests ran side by side also shows the sum of
    its tests' own times and the busy seconds of each xdist worker; with artifacts/times/cpu.txt,
    the /proc/stat samples run_all.sh takes every few seconds, how busy the machine's CPUs were
    during the stage: near 100 % a stage is CPU-bound and more parallelism will not help it),
  * for such a stage, the seconds of each test file (the molecule scenarios are
    tests/integration/test_molecule.py) and the workers that ran it,
  * the N slowest tests across all stages (default 20),

as Markdown, and writes the same to artifacts/test-times.md. Standard library only.

  python3 tests/times_report.py [--dir artifacts/times] [--out artifacts/test-times.md] [--top 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INNER_STAGE = "tests/integration/test_molecule.py::"   # a stage of its own that runs inside another


def mmss(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def read_stages(path: Path) -> list[dict]:
    """stages.tsv rows: name, key, start epoch, end epoch (empty while running), exit status."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or line.startswith("#"):
            continue
        name, key, start = parts[0], parts[1], float(parts[2])
        end = float(parts[3]) if len(parts) > 3 and parts[3] else None
        rc = parts[4] if len(parts) > 4 else ""
        rows.append({"name": name, "key": key, "start": start, "end": end, "rc": rc})
    return rows


def read_cpu(path: Path) -> list[tuple[float, int, int]]:
    """cpu.txt rows "<epoch> cpu <user> <nice> <system> <idle> <iowait> <irq> <softirq> <steal> ...":
    (epoch, busy jiffies, all jiffies) of the whole machine, oldest first."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 10 or parts[1] != "cpu":
            continue
        try:
            t, (user, nice, system, idle, iowait, irq, softirq, steal) = float(parts[0]), map(int, parts[2:10])
        except ValueError:
            continue
        busy = user + nice + system + irq + softirq + steal
        rows.append((t, busy, busy + idle + iowait))
    return rows


def cpu_busy(samples: list[tuple[float, int, int]], start: float, end: float) -> str:
    """The share of all CPU time that was busy between the samples nearest the stage's start and
    end ("" when the stage is shorter than two samples apart)."""
    inside = [s for s in samples if start - 2.5 <= s[0] <= end + 2.5]
    if len(inside) < 2 or inside[-1][2] <= inside[0][2]:
        return ""
    (_, b0, a0), (_, b1, a1) = inside[0], inside[-1]
    return f"{100.0 * (b1 - b0) / (a1 - a0):.0f} %"


def read_tests(directory: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(directory.glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except ValueError:
            continue
    return out


def render(stages: list[dict], tests: dict[str, dict], top: int, cpu: list | None = None) -> str:
    lines = ["# Test times", "", "## Stages", "",
             "| stage | wall | seconds | tests | sum of test times | per worker (busy s) | exit | CPU busy |",
             "|---|---:|---:|---:|---:|---|---:|---:|"]
    total = 0.0
    for st in stages:
        seconds = (st["end"] or st["start"]) - st["start"]
        total += seconds
        run = tests.get(st["key"])
        n = summed = ""
        workers = ""
        if run:
            n = str(len(run["tests"]))
            summed = f"{sum(t['seconds'] for t in run['tests']):.0f}"
            busy: dict[str, float] = defaultdict(float)
            for t in run["tests"]:
                busy[t["worker"]] += t["seconds"]
            if len(busy) > 1:
                workers = ", ".join(f"{w} {s:.0f}" for w, s in sorted(busy.items()))
        state = st["rc"] if st["end"] else "did not finish"
        busy_cpu = cpu_busy(cpu or [], st["start"], st["end"]) if st["end"] else ""
        lines.append(f"| {st['name']} | {mmss(seconds)} | {seconds:.0f} | {n} | {summed} | {workers} | {state} "
                     f"| {busy_cpu} |")
        inner = [t for t in (run or {}).get("tests", []) if INNER_STAGE in t["nodeid"]]
        if inner:   # the molecule scenarios run as tests of this stage, next to the others
            longest = max(t["seconds"] for t in inner)
            lines.append(f"| ↳ molecule (inside the stage above) | {mmss(longest)} | {longest:.0f} | {len(inner)} | "
                         f"{sum(t['seconds'] for t in inner):.0f} | "
                         f"{', '.join(sorted(t['worker'] for t in inner))} | | |")
    if stages:
        wall = max((s["end"] or s["start"]) for s in stages) - min(s["start"] for s in stages)
        first = min(s["start"] for s in stages)
        lines.append(f"| **total** | **{mmss(wall)}** | {wall:.0f} | "
                     f"{sum(len(r['tests']) for r in tests.values())} | | | | {cpu_busy(cpu or [], first, first + wall)} |")
    for key, run in tests.items():   # where a side-by-side stage spends its time, file by file
        busy = {t["worker"] for t in run["tests"]}
        if len(busy) < 2:
            continue
        files: dict[str, list[dict]] = defaultdict(list)
        for t in run["tests"]:
            files[t["nodeid"].split("::")[0]].append(t)
        lines += ["", f"## {key}: by test file (run side by side)", "",
                  "| seconds | tests | workers | file |", "|---:|---:|---|---|"]
        for name, ts in sorted(files.items(), key=lambda kv: -sum(t["seconds"] for t in kv[1])):
            workers = ", ".join(sorted({t["worker"] for t in ts}))
            lines.append(f"| {sum(t['seconds'] for t in ts):.0f} | {len(ts)} | {workers} | `{name}` |")
    every = [dict(t, stage=key) for key, run in tests.items() for t in run["tests"]]
    every.sort(key=lambda t: -t["seconds"])
    lines += ["", f"## The {min(top, len(every))} slowest tests", "",
              "| seconds | stage | worker | outcome | test |", "|---:|---|---|---|---|"]
    for t in every[:top]:
        lines.append(f"| {t['seconds']:.1f} | {t['stage']} | {t['worker']} | {t['outcome']} | `{t['nodeid']}` |")
    counts: dict[str, int] = defaultdict(int)
    for t in every:
        counts[t["outcome"]] += 1
    lines += ["", "Outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) if counts else ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=REPO / "artifacts" / "times")
    ap.add_argument("--out", type=Path, default=REPO / "artifacts" / "test-times.md")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args(argv)
    text = render(read_stages(args.dir / "stages.tsv"), read_tests(args.dir), args.top, read_cpu(args.dir / "cpu.txt"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text, end="")
    print(f"(written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
