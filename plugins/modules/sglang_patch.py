#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: apply the pinned DDTREE patch set to an installed sglang."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_patch
short_description: Apply a checksummed, ordered patch set to an installed sglang, idempotently
description:
  - Applies unified diffs (C(patch -p1), paths relative to site-packages) in the given order to
    the sglang package installed in O(site_packages), using GNU C(patch) on the target.
  - Every patch file is checked against O(checksums) before anything is changed; a patch whose
    sha256 differs, or that has no checksum, fails the task with the tree untouched.
  - Patches already applied (reverse dry run clean) are skipped. The state of the whole set is
    worked out on a scratch copy of the touched files first, so a patch that is neither applied
    nor cleanly applicable fails the task before the real tree is modified.
  - Patches are applied in order. If one fails to apply, or the result fails verification (every
    touched Python file must compile, every O(expect) marker must be present), the patches
    applied by this run are reversed again, so the tree is never left half-patched.
  - The applied set is recorded in C(<site_packages>/sglang/.ddtree-patchset.json) with its
    fingerprint, which is the same value the C(ddtree_patchset_fingerprint) filter computes on
    the controller for venv paths such as C(/opt/sglang/venvs/<version>-<fingerprint>).
  - Nothing is reported as changed when all patches are applied and the stamp already matches.
author:
  - ddtree-fleet maintainers (!UNKNOWN)
options:
  site_packages:
    description:
      - The C(site-packages) directory of the venv that holds the C(sglang) package.
      - Patch paths are relative to it (C(a/sglang/srt/...)).
    type: path
    required: true
  patches:
    description:
      - Patch files on the target, in the order they must be applied (the C(series) order).
      - The basename of each path is the patch name used in O(checksums) and in the stamp.
    type: list
    elements: path
    required: true
  checksums:
    description:
      - Patch name to expected sha256 (hex), usually read from the role's C(SHA256SUMS).
      - Every patch in O(patches) must be listed and must match.
    type: dict
    required: true
  expect:
    description:
      - Relative path (from O(site_packages)) to a list of strings that must be present in that
        file once the whole patch set is applied. Checked before and after applying.
    type: dict
    default: {}
  state:
    description:
      - Only V(present) is supported; remove a patch set by reinstalling the venv.
    type: str
    choices: [present]
    default: present
  patch_executable:
    description:
      - Path to GNU C(patch). Looked up on E(PATH) when not given.
    type: path
notes:
  - Requires GNU C(patch) on the target (Debian package C(patch)).
  - Patches are applied with C(--forward --fuzz=0 --no-backup-if-mismatch -r -), so no C(.orig)
    or C(.rej) files are left behind and a hunk whose context moved is refused rather than fuzzed.
attributes:
  check_mode:
    support: full
    description: Reports which patches would be applied (worked out on a scratch copy) without
      touching the tree or the stamp.
  diff_mode:
    support: partial
    description: Returns the text of every patch applied (or to be applied) by this run, one diff
      entry per patch; the stamp file update is not part of the diff.
  platform:
    support: full
    description: Target OS/families that can be operated against.
    platforms: posix
"""

EXAMPLES = r"""
- name: Apply the DDTREE patch set to the sglang venv
  sglang_patch:
    site_packages: /opt/sglang/venvs/0.5.23-3f2a9c1b7d04/lib/python3.11/site-packages
    patches:
      - /opt/sglang/patches/0001-ddtree-register-algorithm.patch
      - /opt/sglang/patches/0002-ddtree-dflash-family.patch
      - /opt/sglang/patches/0003-ddtree-tree.patch
    checksums:
      0001-ddtree-register-algorithm.patch: "{{ sha256_0001 }}"
      0002-ddtree-dflash-family.patch: "{{ sha256_0002 }}"
      0003-ddtree-tree.patch: "{{ sha256_0003 }}"
    expect:
      sglang/srt/speculative/spec_info.py:
        - "DDTREE = auto()"
      sglang/srt/speculative/spec_utils.py:
        - '"DDTREE"'
  register: sglang_patch_result

- name: Dry run, showing the patches that would be applied
  sglang_patch:
    site_packages: "{{ sglang_site_packages }}"
    patches: "{{ sglang_patch_files }}"
    checksums: "{{ sglang_patch_checksums }}"
  check_mode: true
  diff: true
"""

RETURN = r"""
changed:
  description: Whether patches were applied or the stamp was (re)written.
  returned: always
  type: bool
  sample: true
fingerprint:
  description: Short fingerprint of the ordered (name, sha256) patch list; V(nopatch) when empty.
  returned: always
  type: str
  sample: 3f2a9c1b7d04
applied:
  description: Patch names applied by this run (would be applied, in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: [0002-ddtree-dflash-family.patch]
already_applied:
  description: Patch names that were already applied before this run.
  returned: always
  type: list
  elements: str
  sample: [0001-ddtree-register-algorithm.patch]
files:
  description: Files (relative to O(site_packages)) changed by the patches applied in this run.
  returned: always
  type: list
  elements: str
  sample: [sglang/srt/speculative/spec_info.py, sglang/srt/speculative/spec_utils.py]
stamp:
  description: The stamp record after the run (in check mode, the record that would be written).
  returned: always
  type: dict
  sample:
    fingerprint: 3f2a9c1b7d04
    patches:
      - name: 0001-ddtree-register-algorithm.patch
        sha256: 5b0c0c7f0e0f1d3a7c4b3e9a8f5d2c1b0a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c
    applied_at: "2026-12-02T14:00:00Z"
stamp_path:
  description: Path of the stamp file.
  returned: always
  type: str
  sample: /opt/sglang/venvs/0.5.23-3f2a9c1b7d04/lib/python3.11/site-packages/sglang/.ddtree-patchset.json
patch_version:
  description: First line of C(patch --version) on the target.
  returned: success
  type: str
  sample: GNU patch 2.7.6
failed_patch:
  description: Name of the patch that could not be applied.
  returned: failure
  type: str
patch_output:
  description: GNU patch's output for RV(failed_patch) (C(patch --dry-run) or the real run).
  returned: failure
  type: str
rolled_back:
  description: Patches this run applied and then reversed again after a failure.
  returned: failure
  type: list
  elements: str
problems:
  description: Verification problems (compile errors, missing markers).
  returned: failure
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.ddtree.fleet.plugins.module_utils.patch.series import (PatchConflictError, PatchSetError,
                                               VerificationError, check_gnu_patch, ensure_patchset)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            site_packages=dict(type="path", required=True),
            patches=dict(type="list", elements="path", required=True),
            checksums=dict(type="dict", required=True),
            expect=dict(type="dict", default={}),
            state=dict(type="str", default="present", choices=["present"]),
            patch_executable=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    site = params["site_packages"]

    expect = params["expect"] or {}
    for rel, markers in expect.items():
        # a single string is one marker (verify_tree takes it as such)
        if not isinstance(markers, (str, list)) or not all(isinstance(m, str) for m in markers):
            module.fail_json(msg="expect[%r] must be a list of strings, got %r" % (rel, markers))

    patch_bin = params["patch_executable"] or module.get_bin_path("patch")
    if not patch_bin:
        module.fail_json(msg="GNU patch is required on the target to apply the sglang patch set; "
                             "install the 'patch' package first.", site_packages=site)
    try:
        version = check_gnu_patch(patch_bin)
    except PatchSetError as exc:
        module.fail_json(msg=str(exc), site_packages=site)

    try:
        result = ensure_patchset(site, params["patches"], params["checksums"], expect=expect,
                                 check_mode=module.check_mode, patch_bin=patch_bin)
    except PatchConflictError as exc:
        module.fail_json(msg=str(exc), failed_patch=exc.patch, patch_output=exc.output,
                         rolled_back=exc.rolled_back, site_packages=site)
    except VerificationError as exc:
        module.fail_json(msg=str(exc), problems=exc.problems, rolled_back=exc.rolled_back,
                         site_packages=site)
    except (PatchSetError, OSError) as exc:
        module.fail_json(msg=str(exc), site_packages=site)

    output = {key: result[key] for key in ("changed", "fingerprint", "applied", "already_applied",
                                           "files", "stamp", "stamp_path")}
    if module._diff and result["patches"]:
        site = os.path.abspath(site)
        output["diff"] = []
        for patch in result["patches"]:
            text = patch.text if patch.text.endswith("\n") else patch.text + "\n"
            output["diff"].append({"before_header": "%s (without %s)" % (site, patch.name),
                                   "after_header": "%s (with %s)" % (site, patch.name),
                                   "prepared": "# %s\n%s" % (patch.name, text)})
    module.exit_json(patch_version=version, **output)


if __name__ == "__main__":
    main()
