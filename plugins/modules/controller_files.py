#!/usr/bin/python
# -*- coding: utf-8 -*-
# ddtree-fleet: a directory and the files in it, written as one step, each file atomically.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: controller_files
short_description: Write a directory's files in one step, each atomically (evidence, reports, results)
description:
  - Creates O(dir) (and missing parents, with O(dir_mode)) and writes every file of O(files) into it.
    A file whose content and mode are already those declared is left alone; any other is written to a
    temporary file beside it, flushed and renamed over the old one, so a reader never sees half a file.
  - Used on the controller for the evidence of a failed change, the run reports and the benchmark's
    results. Its action plugin does the work in-process on the controller, whatever the task's host
    (no module run, no connection to the host), so one task replaces a C(copy) per file. Run as a plain
    module (no action plugin), it writes on the host it runs on.
  - Standard library only.
options:
  dir:
    description: The directory, an absolute path.
    type: path
    required: true
  dir_mode:
    description: Mode of the directory and of any parent it creates (an existing directory's mode is left alone).
    type: raw
    default: "0755"
  mode:
    description: Mode of each file that gives none of its own.
    type: raw
    default: "0644"
  files:
    description:
      - The files, each a mapping with C(name) (a plain file name, no C(/)), C(content) (text, written as
        UTF-8) and optionally C(mode).
      - A name given twice is an error, as is a path that exists and is not a regular file.
    type: list
    elements: dict
    required: true
attributes:
  check_mode:
    support: full
    description: Says which files would be written and writes none.
  diff_mode:
    support: full
    description: Before and after of each file written (or that would be), up to Ansible's diff size limit.
author:
  - ddtree-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Write the evidence files
  ddtree.fleet.controller_files:
    dir: /srv/ddtree-fleet/artifacts/ct129/20261207T122530Z
    dir_mode: "0750"
    mode: "0640"
    files:
      - name: summary.json
        content: "{{ summary | to_nice_json }}\n"
      - name: journal.txt
        content: "{{ journal.stdout }}\n"
"""

RETURN = r"""
dir:
  description: The directory.
  returned: always
  type: str
dir_created:
  description: Whether the directory was created (or would be, in check mode).
  returned: always
  type: bool
files:
  description: One entry per file, C(state) being what was found (C(absent), C(differs), C(mode) or C(same)).
  returned: always
  type: list
  elements: dict
  sample: [{name: summary.json, path: /srv/a/summary.json, state: absent, changed: true, size: 812, mode: "0640"}]
written:
  description: Names of the files written (in check mode, those that would be).
  returned: always
  type: list
  elements: str
"""

from ansible_collections.ddtree.fleet.plugins.module_utils.controller_task import module_main
from ansible_collections.ddtree.fleet.plugins.module_utils.files import ARGUMENT_SPEC, write


def main():
    module_main(ARGUMENT_SPEC, write, "controller_files: ")


if __name__ == "__main__":
    main()
