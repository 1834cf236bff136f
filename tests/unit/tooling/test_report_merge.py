"""plugins/module_utils/report.py and bin/ddtree-report: a sliced run's reports merge into the fleet's."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

from ansible_collections.ddtree.fleet.plugins.module_utils import report as dr  # noqa: E402

CLI = REPO / "bin" / "ddtree-report"
STATUS = ["in_sync", "corrected", "in_sync", "quarantined", "in_sync", "failed", "in_sync", "unreachable"]


def entry(i):
    return {"host": "lab%02d" % (i + 1), "status": STATUS[i], "outcome": "unchanged",
            "differences": ["service: sglang.service is inactive"] * (i % 3)}


def sliced(count=4, hosts=8, kind="drift"):
    """The reports of one run cut the way AWX cuts an inventory: host i goes to slice i % count."""
    reports = []
    for k in range(count):
        reports.append({
            "kind": kind, "run": "20261203T120000Z-%d" % k, "check_mode": False,
            "started": "2026-12-03T12:00:0%dZ" % k, "finished": "2026-12-03T12:01:0%dZ" % k,
            "slice": {"number": k + 1, "count": count},
            "hosts": [entry(i) for i in range(hosts) if i % count == k],
        })
    return reports


def test_merge_keeps_every_host_once_in_slice_order():
    reports = sliced()
    shuffled = reports[:]
    random.Random(7).shuffle(shuffled)
    merged = dr.merge(shuffled)
    assert sorted(e["host"] for e in merged["hosts"]) == ["lab%02d" % i for i in range(1, 9)]
    assert [s["number"] for s in merged["slices"]] == [1, 2, 3, 4]
    assert merged["slices"][1]["hosts"] == ["lab02", "lab06"]
    assert merged["started"] == "2026-12-03T12:00:00Z" and merged["finished"] == "2026-12-03T12:01:03Z"
    assert merged["kind"] == "drift" and merged["slice"] is None


def test_merged_textfile_is_the_unsliced_runs():
    """The fleet textfile from 4 slices says per host what one unsliced run over 8 hosts says."""
    merged = dr.merge(sliced())
    whole = dr.textfile([entry(i) for i in range(8)], 1_700_000_000)
    parts = dr.textfile(merged["hosts"], 1_700_000_000)
    assert sorted(whole.splitlines()) == sorted(parts.splitlines())
    assert 'ddtree_fleet_drift_status{host="lab02",status="corrected"} 1' in parts
    assert "ddtree_fleet_drift_corrections 1" in parts
    assert parts.count("ddtree_fleet_drift_status{") == 8 * len(dr.STATUSES)


def test_textfile_format():
    text = dr.textfile([{"host": 'we"ird', "status": "drifted", "differences": ["a", "b"]}], 12.9)
    assert text.splitlines() == [
        "# HELP ddtree_fleet_drift_status Drift status of a host in the last run (1 for its current status).",
        "# TYPE ddtree_fleet_drift_status gauge",
        *['ddtree_fleet_drift_status{host="we\\"ird",status="%s"} %d' % (s, s == "drifted") for s in dr.STATUSES],
        "# HELP ddtree_fleet_drift_differences Differences found on a host in the last run.",
        "# TYPE ddtree_fleet_drift_differences gauge",
        'ddtree_fleet_drift_differences{host="we\\"ird"} 2',
        "# HELP ddtree_fleet_drift_locked_by Another run held the host's lock, so this run checked nothing there "
        "(1 per holder: its controller, run and revision).",
        "# TYPE ddtree_fleet_drift_locked_by gauge",
        "# HELP ddtree_fleet_drift_known_good_info Who promoted the host's known-good configuration: the controller "
        "and the declared revision (a revision that flips between runs: two controllers declare different states).",
        "# TYPE ddtree_fleet_drift_known_good_info gauge",
        "# HELP ddtree_fleet_drift_corrections Hosts corrected in the last run.",
        "# TYPE ddtree_fleet_drift_corrections gauge",
        "ddtree_fleet_drift_corrections 0",
        "# HELP ddtree_fleet_drift_last_run_timestamp_seconds When the last drift run finished.",
        "# TYPE ddtree_fleet_drift_last_run_timestamp_seconds gauge",
        "ddtree_fleet_drift_last_run_timestamp_seconds 12",
    ]


def test_textfile_names_the_lock_holder_and_who_promoted_known_good():
    """A host another run held is "locked", with the holder's controller, run and revision; the
    known-good's promoter is there for every host that has one (two controllers show as a flip)."""
    entries = [
        {"host": "ct129", "status": "locked", "differences": [],
         "lock_holder": {"controller": "ops2", "run": "r-77", "revision": "abc123", "pid": 9},
         "promoted_by": {"controller": "ops1", "run": "r-1", "revision": "def456"}},
        {"host": "ct200", "status": "in_sync", "differences": [], "lock_holder": None,
         "promoted_by": None},
    ]
    lines = dr.textfile(entries, 5).splitlines()
    assert 'ddtree_fleet_drift_status{host="ct129",status="locked"} 1' in lines
    assert 'ddtree_fleet_drift_status{host="ct200",status="locked"} 0' in lines
    assert 'ddtree_fleet_drift_locked_by{host="ct129",controller="ops2",run="r-77",revision="abc123"} 1' in lines
    assert 'ddtree_fleet_drift_known_good_info{host="ct129",controller="ops1",revision="def456"} 1' in lines
    assert not [line for line in lines if line.startswith(("ddtree_fleet_drift_locked_by{host=\"ct200\"",
                                                             "ddtree_fleet_drift_known_good_info{host=\"ct200\""))]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda r: r.pop(2), "slices of 4: missing 3"),
        (lambda r: r.append(dict(r[0])), "doubled 1"),
        (lambda r: r[3]["hosts"].append(entry(0)), "host lab01 is in slice 1 and slice 4"),
        (lambda r: r[1].update(slice=None), "unsliced run: 20261203T120000Z-1"),
        (lambda r: r[1].update(kind="deploy"), "different kinds"),
        (lambda r: r[1].update(check_mode=True), "check-mode and real runs mixed"),
        (lambda r: r[1]["slice"].update(count=5), "different numbers of parts"),
        (lambda r: r.clear(), "no report"),
    ],
)
def test_merge_refuses_reports_that_lose_or_double_a_host(damage, message):
    reports = sliced()
    damage(reports)
    with pytest.raises(dr.ReportError, match=message.replace("(", r"\(")):
        dr.merge(reports)


@pytest.mark.parametrize("text, parsed", [("2/4", {"number": 2, "count": 4}), (" 1 / 1 ", {"number": 1, "count": 1}),
                                          ("", None), (None, None)])
def test_parse_slice(text, parsed):
    assert dr.parse_slice(text) == parsed


@pytest.mark.parametrize("bad", ["0/4", "5/4", "2", "a/b", "2/0", "-1/4"])
def test_parse_slice_rejects(bad):
    with pytest.raises(dr.ReportError, match="expected K/N"):
        dr.parse_slice(bad)


def test_slice_suffix():
    assert dr.slice_suffix("3/4") == ".slice-3-of-4" and dr.slice_suffix("") == ""


def _write_slices(directory, reports):
    for r in reports:
        s = r["slice"]
        (directory / ("latest.slice-%d-of-%d.json" % (s["number"], s["count"]))).write_text(json.dumps(r))


def test_cli_merges_a_directory(tmp_path):
    _write_slices(tmp_path, sliced())
    out, prom = tmp_path / "fleet.json", tmp_path / "fleet.prom"
    proc = subprocess.run([sys.executable, str(CLI), "merge", str(tmp_path), "--out", str(out), "--textfile", str(prom)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "8 hosts from 4 slices" in proc.stderr
    assert len(json.loads(out.read_text())["hosts"]) == 8
    finished = dr.iso_seconds("2026-12-03T12:01:03Z")
    assert prom.read_text().endswith("ddtree_fleet_drift_last_run_timestamp_seconds %d\n" % finished)


def test_cli_exit_statuses(tmp_path):
    reports = sliced()
    _write_slices(tmp_path, reports[:3])
    proc = subprocess.run([sys.executable, str(CLI), "merge", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1 and "missing 4" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, str(CLI), "merge", str(tmp_path / "nothing.json")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "nothing.json" in proc.stderr
