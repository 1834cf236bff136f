# -*- coding: utf-8 -*-
"""Controller-side filters for the DDTREE patch set.

The logic lives in ``module_utils/ddtree_patch.py`` (also shipped to targets
with the ``sglang_patch`` module); this plugin loads that same file by path, so
the fingerprint in venv paths and the one in the target's stamp come from one
implementation.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from ansible.errors import AnsibleFilterError

_MODULE_NAME = "_ddtree_fleet_ddtree_patch"


def _load_logic():
    loaded = sys.modules.get(_MODULE_NAME)
    if loaded is not None:
        return loaded
    here = os.path.dirname(os.path.realpath(__file__))
    path = os.path.join(here, os.pardir, "module_utils", "ddtree_patch.py")
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, os.path.normpath(path))
    if spec is None or spec.loader is None:  # pragma: no cover
        raise AnsibleFilterError("cannot load %s" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(_MODULE_NAME, None)
        raise
    return module


def ddtree_patchset_fingerprint(entries, length=None):
    """Short fingerprint of a list of ``{"name", "sha256"}`` (``nopatch`` if empty)."""
    logic = _load_logic()
    try:
        if length is None:
            return logic.patchset_fingerprint(entries)
        return logic.patchset_fingerprint(entries, length=int(length))
    except logic.PatchSetError as exc:
        raise AnsibleFilterError("ddtree_patchset_fingerprint: %s" % exc)


def ddtree_parse_series(text):
    """Ordered patch names from the text of a ``series`` file."""
    logic = _load_logic()
    try:
        return logic.parse_series(text)
    except logic.PatchSetError as exc:
        raise AnsibleFilterError("ddtree_parse_series: %s" % exc)


def ddtree_parse_sha256sums(text):
    """``{name: sha256}`` from the text of a ``SHA256SUMS`` file."""
    logic = _load_logic()
    try:
        return logic.parse_sha256sums(text)
    except logic.PatchSetError as exc:
        raise AnsibleFilterError("ddtree_parse_sha256sums: %s" % exc)


def ddtree_patchset_entries(names, checksums):
    """``[{"name", "sha256"}]`` in series order; every name needs a checksum."""
    missing = [n for n in names if n not in checksums]
    if missing:
        raise AnsibleFilterError("ddtree_patchset_entries: no checksum for %s" % ", ".join(missing))
    return [{"name": n, "sha256": str(checksums[n]).lower()} for n in names]


class FilterModule:
    def filters(self):
        return {
            "ddtree_patchset_fingerprint": ddtree_patchset_fingerprint,
            "ddtree_parse_series": ddtree_parse_series,
            "ddtree_parse_sha256sums": ddtree_parse_sha256sums,
            "ddtree_patchset_entries": ddtree_patchset_entries,
        }
