# -*- coding: utf-8 -*-
"""The module side of a controller-only task (controller_files, artifact_retention).

Their action plugins run ``work(params, check_mode, diff)`` in the controller's worker process
(plugins/plugin_utils/controller_action.py); run as plain modules, ``module_main`` does the same
under AnsibleModule: the same argument spec, the same function, a ValueError or OSError as the
failure's message after ``fail_prefix``.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule


def module_main(argument_spec, work, fail_prefix=""):
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    try:
        result = work(module.params, module.check_mode, module._diff)
    except (ValueError, OSError) as exc:
        module.fail_json(msg=fail_prefix + str(exc))
    module.exit_json(**result)
