"""Jinja filters for the run report (logic lives in module_utils/ddtree_report.py)."""
from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleFilterError

_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)

import ddtree_report  # noqa: E402  (path set above: one implementation for the role, bin/ddtree-report and tests)


def ddtree_drift_textfile(entries, timestamp):
    return ddtree_report.textfile(list(entries or []), float(timestamp))


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
            "ddtree_drift_textfile": ddtree_drift_textfile,
            "ddtree_slice": _slice_filter(ddtree_report.parse_slice),
            "ddtree_slice_suffix": _slice_filter(ddtree_report.slice_suffix),
        }
