#!/usr/bin/python
# -*- coding: utf-8 -*-
# ddtree-fleet: collect old known-good records, venvs, weight revisions and patch sets on a host.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_retention
short_description: Remove a host's old records, venvs, weight revisions, patch sets and evidence, never what a kept record needs
description:
  - Every change leaves its venv, its weights revision, its patch set and its known-good record behind; nothing
    else ever removes them. This module keeps, always, the known-good record, the declared configuration's
    record, the declared venv and weights, everything a kept record names in its C(meta.json) (C(venv),
    C(model_dir), C(draft_dir)) and the patch sets of kept venvs; and besides them the O(keep) most recent
    others of each kind (records; venvs; revisions of each model repository; the watchdog's evidence
    directories under C(<state_dir>/evidence)). The rest is removed.
  - Directories still being built (C(*.partial)) and symlinks are left alone.
  - Run it under the host's lock (role retention does), so no other run is building what it removes.
options:
  state_dir:
    description: The fleet's state directory (C(records/), the C(known-good) link).
    type: path
    required: true
  venv_root:
    description: Where the versioned venvs live.
    type: path
    required: true
  models_root:
    description: Where the weights live (C(<repo>/<revision>)).
    type: path
    required: true
  patch_root:
    description: Where the patch sets live (C(<patch set>/)).
    type: path
    required: true
  declared:
    description: The declared configuration, kept whatever its age.
    type: dict
    required: true
    suboptions:
      fingerprint:
        description: Its fingerprint (its record's name).
        type: str
        required: true
      venv:
        description: Its venv.
        type: path
        required: true
      weights:
        description: Its weights directories (target, and draft when it has one).
        type: list
        elements: path
        required: true
  keep:
    description: How many of each kind to keep besides those that must stay.
    type: int
    default: 2
attributes:
  check_mode:
    support: full
    description: Lists what it would remove and reports a change, removing nothing.
  diff_mode:
    support: full
    description: The directories removed (or that would be), one per line.
author:
  - ddtree-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Collect what no kept record needs
  ddtree.fleet.host_retention:
    state_dir: /var/lib/ddtree-fleet
    venv_root: /opt/sglang/venvs
    models_root: /opt/sglang/models
    patch_root: /opt/sglang/patches
    declared:
      fingerprint: e60c091a62ba1d0d
      venv: /opt/sglang/venvs/0.5.23-e5d8d19cf6e2
      weights: [/opt/sglang/models/Qwen--Qwen3.6-27B/cc771039f153425de31921a0cd964651b8652914]
    keep: 2
"""

RETURN = r"""
removed:
  description: What was removed (or would be, in check mode), per kind.
  returned: always
  type: dict
  sample: {records: [/var/lib/ddtree-fleet/records/0a1b2c3d4e5f6a7b], venvs: [], weights: [], patches: [], evidence: []}
kept:
  description: What stays, per kind.
  returned: always
  type: dict
freed_bytes:
  description: Bytes of the removed files (counted before removal; in check mode, what would be freed).
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.retention import KINDS, carry_out, plan


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state_dir=dict(type="path", required=True),
            venv_root=dict(type="path", required=True),
            models_root=dict(type="path", required=True),
            patch_root=dict(type="path", required=True),
            declared=dict(type="dict", required=True, options=dict(
                fingerprint=dict(type="str", required=True),
                venv=dict(type="path", required=True),
                weights=dict(type="list", elements="path", required=True),
            )),
            keep=dict(type="int", default=2),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["keep"] < 0:
        module.fail_json(msg="keep=%d: expected 0 or more" % p["keep"])
    try:
        planned = plan(p["state_dir"], p["venv_root"], p["models_root"], p["patch_root"], p["declared"], p["keep"])
        result = carry_out(planned, KINDS, module.check_mode, module._diff)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="cannot collect old versions on the host: %s" % exc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
