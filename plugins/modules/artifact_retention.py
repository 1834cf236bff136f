#!/usr/bin/python
# -*- coding: utf-8 -*-
# ddtree-fleet: collect old run reports and old evidence under the controller's artifacts directory.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: artifact_retention
short_description: Remove old run reports and old evidence of failed changes from the controller's artifacts
description:
  - Every run writes a report (C(<artifacts_dir>/deploy/<run>.json), C(<artifacts_dir>/drift/<run>.json)) and
    every failed change an evidence directory (C(<artifacts_dir>/<host>/<time>/)); nothing else ever removes them.
  - Keeps the O(keep_runs) newest reports of each kind (C(latest*.json) always stay), and per host in O(hosts) the
    O(keep_evidence) newest evidence directories plus every directory in O(protected). Evidence of hosts not in
    O(hosts) is left alone. The rest is removed.
  - Runs on the controller (role retention, entry point C(controller)); its action plugin does the work in the
    controller's worker process, whatever the task's host.
options:
  artifacts_dir:
    description: The controller's artifacts directory (C(ddtree_artifacts_dir)).
    type: path
    required: true
  hosts:
    description: The hosts whose evidence may be collected (the run's targets).
    type: list
    elements: str
    default: []
  protected:
    description: Evidence directories that stay whatever their age (those a quarantine or the run's report names).
    type: list
    elements: path
    default: []
  keep_runs:
    description: Reports of each kind (deploy, drift) to keep.
    type: int
    default: 200
  keep_evidence:
    description: Evidence directories to keep per host, besides the protected ones.
    type: int
    default: 20
attributes:
  check_mode:
    support: full
    description: Lists what it would remove and reports a change, removing nothing.
  diff_mode:
    support: full
    description: The files and directories removed (or that would be), one per line.
author:
  - ddtree-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Collect old reports and evidence
  ddtree.fleet.artifact_retention:
    artifacts_dir: /srv/ddtree-fleet/artifacts
    hosts: [ct129, ct200]
    protected: [/srv/ddtree-fleet/artifacts/ct129/20261207T122530Z]
    keep_runs: 200
    keep_evidence: 20
  delegate_to: localhost
"""

RETURN = r"""
removed:
  description: What was removed (or would be, in check mode), per kind (C(reports), C(evidence)).
  returned: always
  type: dict
  sample: {reports: [/srv/ddtree-fleet/artifacts/deploy/20260101T000000Z-1234.json], evidence: []}
kept:
  description: What stays, per kind.
  returned: always
  type: dict
freed_bytes:
  description: Bytes of the removed files (in check mode, what would be freed).
  returned: always
  type: int
"""

from ansible_collections.ddtree.fleet.plugins.module_utils.controller_task import module_main
from ansible_collections.ddtree.fleet.plugins.module_utils.retention import CONTROLLER_ARGUMENT_SPEC, collect_controller


def main():
    module_main(CONTROLLER_ARGUMENT_SPEC, collect_controller)


if __name__ == "__main__":
    main()
