# -*- coding: utf-8 -*-
"""Action plugin for controller_files: the files are written here, on the controller.

The module's work done in the worker process itself (plugins/module_utils/files.py), with no
module run and no connection to the task's host: writing the eight evidence files of a failed
change took eight ``copy`` runs (about 3.4 CPU-seconds on the lab controller), now one step.
Check mode and --diff behave as the module's documentation says.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ddtree.fleet.plugins.module_utils import files as ddtree_files


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ddtree_files.ARGUMENT_SPEC)
        try:
            the_plan = ddtree_files.plan(args["dir"], args["files"], args["dir_mode"], args["mode"])
            if not self._task.check_mode:
                ddtree_files.apply(the_plan)
        except (ddtree_files.FilesError, OSError) as exc:
            result.update(failed=True, msg="controller_files: %s" % exc)
            return result
        out, diffs = ddtree_files.result(the_plan)
        result.update(out)
        result["changed"] = the_plan["dir_created"] or bool(out["written"])
        if self._task.diff and diffs:
            result["diff"] = diffs
        return result
