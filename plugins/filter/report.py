"""Jinja filters for the run report (role run_report; logic lives in module_utils/report.py)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


from ansible_collections.ddtree.fleet.plugins.module_utils import report as ddtree_report


def prometheus_textfile(entries, timestamp):
    """The drift metrics (ddtree_fleet_drift_*) of a run's host entries, in the textfile format."""
    return ddtree_report.textfile(list(entries or []), float(timestamp))


def speed_textfile(entry, timestamp):
    """One host's last speed gate (ddtree_fleet_speed_*) from its report entry, in the textfile format."""
    return ddtree_report.speed_textfile(dict(entry), float(timestamp))


def _slice_filter(func):
    """``func`` (parse_slice or slice_suffix) with a bad K/N reported as a filter error."""
    def run(text):
        try:
            return func(text)
        except ddtree_report.ReportError as exc:
            raise AnsibleFilterError(str(exc)) from exc
    return run


class FilterModule:
    def filters(self):
        return {
            "prometheus_textfile": prometheus_textfile,
            "speed_textfile": speed_textfile,
            "run_slice": _slice_filter(ddtree_report.parse_slice),
            "slice_suffix": _slice_filter(ddtree_report.slice_suffix),
        }
