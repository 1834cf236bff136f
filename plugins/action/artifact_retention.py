# -*- coding: utf-8 -*-
"""Action plugin for artifact_retention: old reports and evidence collected here, on the
controller, in-process (plugins/plugin_utils/controller_action.py; the logic is
plugins/module_utils/retention.py). Every deploy and drift run ends with it: a module run
(about 0.4 CPU-seconds) saved each time."""

from __future__ import annotations

from ansible_collections.ddtree.fleet.plugins.module_utils import retention
from ansible_collections.ddtree.fleet.plugins.plugin_utils.controller_action import ControllerAction


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = retention.CONTROLLER_ARGUMENT_SPEC

    def work(self, args, check_mode, diff):
        return retention.collect_controller(args, check_mode, diff)
