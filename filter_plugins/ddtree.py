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


def ddtree_patch_plan(series_text, sums_text, selected, extras, patch_dir):
    """The patch set to apply, ``[{"name", "src", "sha256"}]``: the selected built-ins in series
    order, then the user's patches (``sglang_patches``, ``sglang_extra_patches``)."""
    logic = _load_logic()
    try:
        return logic.select_patches(str(series_text), str(sums_text), selected, extras, str(patch_dir))
    except logic.PatchSetError as exc:
        raise AnsibleFilterError("ddtree_patch_plan: %s" % exc)


def ddtree_patch_series(series_text):
    """The patch names of a ``series`` file, in order (the strict parser of the patch plan)."""
    logic = _load_logic()
    try:
        return logic.parse_series(str(series_text))
    except logic.PatchSetError as exc:
        raise AnsibleFilterError("ddtree_patch_series: %s" % exc)


def ddtree_patches_adding(plan, target, marker):
    """Names of the patches in ``plan`` (``ddtree_patch_plan``'s entries, read from their ``src``
    on the controller) that add a line containing ``marker`` to ``target``: which patch of the
    set provides a field (and so a flag) that stock SGLang lacks. An unreadable file provides
    nothing (the install's checksum step names it)."""
    logic = _load_logic()
    names = []
    for entry in plan or []:
        try:
            with open(str(entry["src"]), "r", encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, KeyError, TypeError, UnicodeDecodeError):
            continue
        try:
            if logic.patch_adds(text, str(target), str(marker)):
                names.append(entry["name"])
        except logic.PatchSetError as exc:
            raise AnsibleFilterError("ddtree_patches_adding: %s: %s" % (entry.get("name"), exc))
    return names


class FilterModule:
    def filters(self):
        return {
            "ddtree_patchset_fingerprint": ddtree_patchset_fingerprint,
            "ddtree_patch_plan": ddtree_patch_plan,
            "ddtree_patch_series": ddtree_patch_series,
            "ddtree_patches_adding": ddtree_patches_adding,
        }
