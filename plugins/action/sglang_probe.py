# -*- coding: utf-8 -*-
"""Action plugin for sglang_probe: the probe runs on the host, the text is judged again here.

The module (library/sglang_probe.py) runs on the target host with the host's python3 and the
standard library only, so its text judgement is the stdlib one. On the controller,
module_utils/ddtree_textcheck.py can also use the pinned libraries of the project venv (ftfy for
mojibake, a word-frequency list for word salad, language identification for language switches).
This plugin runs the module, then judges every prompt that passed again with those judges
(ddtree_probe.rejudge_text): one judge, at its best where it can run. A prompt found degenerate
here fails the report exactly as on the host, and O(fail_on) applies to the final verdict.

It also merges O(settings), the options every probe of a deployment shares (the quality_gate
role's quality_gate_probe_settings), under the options the task gives itself, so the gate, the
baseline and the restore handler write that call once. An empty api_key is left out.
"""

from __future__ import annotations

import os
import sys

from ansible.plugins.action import ActionBase

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as ddtree_probe
from ansible_collections.ddtree.fleet.plugins.module_utils.textcheck import judge as ddtree_textcheck


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        settings = args.pop("settings", None) or {}
        if not isinstance(settings, dict):
            result.update(failed=True, msg="sglang_probe: settings must be a mapping of the module's options, got %s"
                          % type(settings).__name__)
            return result
        args = dict(settings, **args)
        if not args.get("api_key"):
            args.pop("api_key", None)
        result.update(self._execute_module(module_name="ddtree.fleet.sglang_probe", module_args=args, task_vars=task_vars))
        report = result.get("report")
        if not isinstance(report, dict):
            return result
        new = ddtree_probe.rejudge_text(report)
        report.setdefault("text_judges", {}).update(controller=ddtree_textcheck.judges(),
                                                    controller_failed=new)
        if new:
            result.update(verdict=report["verdict"], passed=report["passed"],
                          reasons=report["reasons"])
            if report["verdict"] in (self._task.args.get("fail_on") or []) \
                    and not result.get("failed"):
                result["failed"] = True
                result["msg"] = "quality probe of %s: %s (%s)" % (
                    report.get("url"), report["verdict"], "; ".join(report["reasons"][:3]))
        return result
