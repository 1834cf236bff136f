# -*- coding: utf-8 -*-
"""Action plugin for controller_files: the files are written here, on the controller, in-process
(plugins/plugin_utils/controller_action.py; the logic is plugins/module_utils/files.py).

Writing the eight evidence files of a failed change took eight ``copy`` runs (about 3.4
CPU-seconds on the lab controller); it is one step now.
"""

from __future__ import annotations

from ansible_collections.ddtree.fleet.plugins.module_utils import files as ddtree_files
from ansible_collections.ddtree.fleet.plugins.plugin_utils.controller_action import ControllerAction


class ActionModule(ControllerAction):
    ARGUMENT_SPEC = ddtree_files.ARGUMENT_SPEC
    FAIL_PREFIX = "controller_files: "

    def work(self, args, check_mode, diff):
        return ddtree_files.write(args, check_mode, diff)
