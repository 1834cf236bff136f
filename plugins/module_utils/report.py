# -*- coding: utf-8 -*-
# ddtree-fleet: the run report's Prometheus textfile, and the merge of sliced runs' reports.
#
# Controller side (filter_plugins/ddtree_report.py for roles/drift/tasks/report.yml, and
# bin/ddtree-report). A run sliced into N parts (AWX job slicing, or N `--limit` runs with
# -e ddtree_slice=K/N) writes one report per slice; merge() gives the fleet report the unsliced
# run would have written, and refuses to give one that lost or doubled a host.

from __future__ import annotations

import datetime
import re

STATUSES = ("in_sync", "drifted", "corrected", "quarantined", "locked", "failed", "skipped", "unreachable")
_SLICE = re.compile(r"^\s*([1-9][0-9]*)\s*/\s*([1-9][0-9]*)\s*$")


class ReportError(ValueError):
    """Reports that cannot be merged into one fleet report (the message says which and why)."""


def parse_slice(text):
    """'2/4' -> {'number': 2, 'count': 4}; '' or None -> None (an unsliced run)."""
    if text is None or str(text).strip() == "":
        return None
    m = _SLICE.match(str(text))
    if not m or int(m.group(1)) > int(m.group(2)):
        raise ReportError("ddtree_slice=%r: expected K/N with 1 <= K <= N, like 2/4" % (text,))
    return {"number": int(m.group(1)), "count": int(m.group(2))}


def slice_suffix(text):
    """The file-name part of a slice: '' for an unsliced run, '.slice-2-of-4' for 2/4."""
    parsed = parse_slice(text)
    return "" if parsed is None else ".slice-%d-of-%d" % (parsed["number"], parsed["count"])


def _label(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def textfile(entries, timestamp):
    """The drift run's Prometheus textfile (node_exporter's textfile collector format)."""
    lines = [
        "# HELP ddtree_fleet_drift_status Drift status of a host in the last run (1 for its current status).",
        "# TYPE ddtree_fleet_drift_status gauge",
    ]
    for entry in entries:
        for status in STATUSES:
            lines.append('ddtree_fleet_drift_status{host="%s",status="%s"} %d'
                         % (_label(entry["host"]), status, 1 if entry["status"] == status else 0))
    lines += [
        "# HELP ddtree_fleet_drift_differences Differences found on a host in the last run.",
        "# TYPE ddtree_fleet_drift_differences gauge",
    ]
    for entry in entries:
        lines.append('ddtree_fleet_drift_differences{host="%s"} %d'
                     % (_label(entry["host"]), len(entry.get("differences") or [])))
    lines += [
        "# HELP ddtree_fleet_drift_locked_by Another run held the host's lock, so this run checked nothing there "
        "(1 per holder: its controller, run and revision).",
        "# TYPE ddtree_fleet_drift_locked_by gauge",
    ]
    for entry in entries:
        holder = entry.get("lock_holder")
        if entry["status"] == "locked" and holder:
            lines.append('ddtree_fleet_drift_locked_by{host="%s",controller="%s",run="%s",revision="%s"} 1' % tuple(
                _label(v) for v in (entry["host"], holder.get("controller", ""), holder.get("run", ""),
                                    holder.get("revision", ""))))
    lines += [
        "# HELP ddtree_fleet_drift_known_good_info Who promoted the host's known-good configuration: the controller "
        "and the declared revision (a revision that flips between runs: two controllers declare different states).",
        "# TYPE ddtree_fleet_drift_known_good_info gauge",
    ]
    for entry in entries:
        by = entry.get("promoted_by")
        if by:
            lines.append('ddtree_fleet_drift_known_good_info{host="%s",controller="%s",revision="%s"} 1' % tuple(
                _label(v) for v in (entry["host"], by.get("controller", ""), by.get("revision", ""))))
    lines += [
        "# HELP ddtree_fleet_drift_corrections Hosts corrected in the last run.",
        "# TYPE ddtree_fleet_drift_corrections gauge",
        "ddtree_fleet_drift_corrections %d" % sum(1 for e in entries if e["status"] == "corrected"),
        "# HELP ddtree_fleet_drift_last_run_timestamp_seconds When the last drift run finished.",
        "# TYPE ddtree_fleet_drift_last_run_timestamp_seconds gauge",
        "ddtree_fleet_drift_last_run_timestamp_seconds %d" % int(timestamp),
    ]
    return "\n".join(lines) + "\n"


SPEED_HELP = {
    "ddtree_fleet_speed_tokens_per_second": "Median output tokens/s of the speed gate's rounds, per service.",
    "ddtree_fleet_speed_ratio": "Candidate / known-good throughput: the Hodges-Lehmann estimate and its interval.",
    "ddtree_fleet_speed_ttft_seconds": "Time to first token of the candidate under the speed gate's load.",
    "ddtree_fleet_speed_itl_seconds": "Inter-token latency of the candidate under the speed gate's load.",
    "ddtree_fleet_speed_verdict": "The speed gate's verdict (1 for the verdict of the host's last gate).",
    "ddtree_fleet_speed_gate_seconds": "Wall time of the candidate's speed measurement.",
    "ddtree_fleet_speed_last_gate_timestamp_seconds": "When the host's last speed gate was reported.",
}


def speed_textfile(entry, timestamp):
    """One host's last speed gate (its report entry's ``speed``), in the textfile format: per
    concurrency level the candidate's and the known-good's tokens/s, the ratio with its interval,
    TTFT and ITL percentiles; the verdict; when it was measured."""
    sp = entry.get("speed") or {}
    samples = {name: [] for name in SPEED_HELP}

    def put(name, labels, value):
        if value is not None:
            text = ",".join('%s="%s"' % (k, _label(v)) for k, v in [("host", entry["host"])] + labels)
            samples[name].append("%s{%s} %s" % (name, text, repr(float(value))))

    known = {int(lv["concurrency"]): lv for lv in sp.get("known_good_levels") or []}
    for lv in sp.get("levels") or []:
        c = str(lv["concurrency"])
        put("ddtree_fleet_speed_tokens_per_second", [("concurrency", c), ("service", "candidate")], lv.get("tokens_per_s"))
        put("ddtree_fleet_speed_tokens_per_second", [("concurrency", c), ("service", "known_good")],
            (known.get(int(lv["concurrency"])) or {}).get("tokens_per_s"))
        for bound, key in (("estimate", "ratio"), ("low", "ratio_low"), ("high", "ratio_high")):
            put("ddtree_fleet_speed_ratio", [("concurrency", c), ("bound", bound)], lv.get(key))
        for metric in ("ttft", "itl"):
            for q, quantile in (("50", "0.5"), ("99", "0.99")):
                value = lv.get("%s_p%s_ms" % (metric, q))
                put("ddtree_fleet_speed_%s_seconds" % metric, [("concurrency", c), ("quantile", quantile)],
                    None if value is None else value / 1000.0)
    for verdict in ("pass", "fail", "inconclusive", "measured"):
        put("ddtree_fleet_speed_verdict", [("verdict", verdict)], 1 if sp.get("verdict") == verdict else 0)
    put("ddtree_fleet_speed_gate_seconds", [], sp.get("seconds"))
    put("ddtree_fleet_speed_last_gate_timestamp_seconds", [], int(timestamp))
    lines = []
    for name, rows in samples.items():
        if rows:
            lines += ["# HELP %s %s" % (name, SPEED_HELP[name]), "# TYPE %s gauge" % name] + rows
    return "\n".join(lines) + "\n"


def iso_seconds(text):
    """'2026-12-03T12:00:00Z' -> epoch seconds."""
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def merge(reports):
    """One fleet report from the reports of every slice of one run (any order).

    Every slice 1..N must be there exactly once, all of the same kind and mode, and no host may
    be in two slices; otherwise ReportError names what is missing or doubled.
    """
    if not reports:
        raise ReportError("no report to merge")
    kinds = sorted({r.get("kind") for r in reports})
    if len(kinds) != 1:
        raise ReportError("reports of different kinds: %s" % ", ".join(map(str, kinds)))
    if len({bool(r.get("check_mode")) for r in reports}) != 1:
        raise ReportError("check-mode and real runs mixed")
    slices = [r.get("slice") for r in reports]
    if any(s is None for s in slices):
        runs = [r.get("run", "?") for r, s in zip(reports, slices) if s is None]
        raise ReportError("report(s) of an unsliced run: %s; merge the reports of one sliced run "
                          "(written with -e ddtree_slice=K/N)" % ", ".join(runs))
    counts = sorted({s["count"] for s in slices})
    if len(counts) != 1:
        raise ReportError("slices of runs cut in different numbers of parts: %s" % counts)
    count = counts[0]
    numbers = sorted(s["number"] for s in slices)
    missing = [n for n in range(1, count + 1) if n not in numbers]
    doubled = sorted({n for n in numbers if numbers.count(n) > 1})
    problems = ["%s %s" % (what, ", ".join(map(str, ns)))
                for what, ns in (("missing", missing), ("doubled", doubled)) if ns]
    if problems:
        raise ReportError("slices of %d: %s" % (count, "; ".join(problems)))
    ordered = sorted(reports, key=lambda r: r["slice"]["number"])
    seen = {}
    hosts = []
    for report in ordered:
        for entry in report.get("hosts") or []:
            if entry["host"] in seen:
                raise ReportError("host %s is in slice %d and slice %d" % (
                    entry["host"], seen[entry["host"]], report["slice"]["number"]))
            seen[entry["host"]] = report["slice"]["number"]
            hosts.append(entry)
    return {
        "kind": kinds[0],
        "run": ",".join(r.get("run", "") for r in ordered),
        "check_mode": bool(ordered[0].get("check_mode")),
        "started": min((r["started"] for r in ordered if r.get("started")), default=""),
        "finished": max((r["finished"] for r in ordered if r.get("finished")), default=""),
        "slice": None,
        "slices": [{"number": r["slice"]["number"], "run": r.get("run", ""),
                    "hosts": [e["host"] for e in r.get("hosts") or []]} for r in ordered],
        "hosts": hosts,
    }
