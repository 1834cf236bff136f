# -*- coding: utf-8 -*-
"""Aggregate callback of tests/integration/test_bad_input_matrix.py: every host's task results
(play index, task name, changed, failed, ignored, msg) written as JSON to $BADINPUT_RESULTS when
the run ends (ansible.posix.json is not installed with ansible-core)."""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: badinput_results
type: aggregate
short_description: write per-host task results to $BADINPUT_RESULTS (tests only)
description: Test helper of tests/integration/test_bad_input_matrix.py.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "badinput_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.plays = []

    def v2_playbook_on_play_start(self, play):
        self.plays.append({"name": play.get_name(), "results": []})

    def _record(self, result, status):
        res = result._result
        items = [{"failed": bool(r.get("failed")), "msg": str(r.get("msg", ""))}
                 for r in res.get("results", []) if isinstance(r, dict)]
        msg = res.get("msg", "")
        self.plays[-1]["results"].append({
            "host": result._host.get_name(), "task": result._task.get_name(), "status": status,
            "changed": bool(res.get("changed")), "ignored": bool(result._task.ignore_errors),
            "msg": msg if isinstance(msg, str) else json.dumps(msg, default=str), "items": items})

    def v2_runner_on_ok(self, result):
        self._record(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "unreachable")

    def v2_runner_on_skipped(self, result):
        self._record(result, "skipped")

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("BADINPUT_RESULTS")
        if path:
            with open(path, "w") as fh:
                json.dump({"plays": self.plays}, fh)
