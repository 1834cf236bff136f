# -*- coding: utf-8 -*-
"""A module's work done in the controller's worker process, for modules that only ever run on
the controller (controller_files, artifact_retention).

Delegated to localhost, such a module costs a module run: a new Python, AnsiballZ, its imports,
about 0.4 CPU-seconds on the lab controller each time. Their action plugins subclass
``ControllerAction``: the task's arguments are checked against the module's own argument spec
(kept in module_utils, where the module reads it too), then ``work`` runs in-process with the
same module_utils code the module calls. The task's host is never contacted.

``work(args, check_mode, diff)`` returns the result dict (``changed`` included); it raises
``ValueError`` or ``OSError`` for a failure, whose text becomes the task's ``msg`` after
``FAIL_PREFIX``.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ControllerAction(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    ARGUMENT_SPEC: dict = {}
    FAIL_PREFIX = ""

    def work(self, args: dict, check_mode: bool, diff: bool) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        try:
            out = self.work(args, bool(self._task.check_mode), bool(self._task.diff))
        except (ValueError, OSError) as exc:
            result.update(failed=True, msg=self.FAIL_PREFIX + str(exc))
            return result
        if not self._task.diff:
            out.pop("diff", None)
        result.update(out)
        return result
