# -*- coding: utf-8 -*-
"""Controller-side filters for the DDTREE patch set.

The logic lives in ``module_utils/ddtree_patch.py``, the file the ``sglang_patch`` module ships
to the hosts, so the fingerprint in venv paths and the one in a host's stamp come from one
implementation.
"""

from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleFilterError

_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)

import ddtree_patch  # noqa: E402  (path set above: one implementation for modules, filters and tests)


def _call(name, func, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except ddtree_patch.PatchSetError as exc:
        raise AnsibleFilterError("%s: %s" % (name, exc)) from exc


def ddtree_patchset_fingerprint(entries, length=None):
    """Short fingerprint of a list of ``{"name", "sha256"}`` (``nopatch`` if empty)."""
    kwargs = {} if length is None else {"length": int(length)}
    return _call("ddtree_patchset_fingerprint", ddtree_patch.patchset_fingerprint, entries, **kwargs)


def ddtree_patch_plan(series_text, sums_text, selected, extras, patch_dir):
    """The patch set to apply, ``[{"name", "src", "sha256"}]``: the selected built-ins in series
    order, then the user's patches (``sglang_patches``, ``sglang_extra_patches``)."""
    return _call("ddtree_patch_plan", ddtree_patch.select_patches, str(series_text), str(sums_text),
                 selected, extras, str(patch_dir))


def ddtree_patch_series(series_text):
    """The patch names of a ``series`` file, in order (the strict parser of the patch plan)."""
    return _call("ddtree_patch_series", ddtree_patch.parse_series, str(series_text))


def ddtree_patches_adding(plan, target, marker):
    """Names of the patches in ``plan`` (``ddtree_patch_plan``'s entries, read from their ``src``
    on the controller) that add a line containing ``marker`` to ``target``: which patch of the
    set provides a field (and so a flag) that stock SGLang lacks. An unreadable file provides
    nothing (the install's checksum step names it)."""
    names = []
    for entry in plan or []:
        try:
            with open(str(entry["src"]), "r", encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, KeyError, TypeError, UnicodeDecodeError):
            continue
        if _call("ddtree_patches_adding: %s" % entry.get("name"), ddtree_patch.patch_adds,
                 text, str(target), str(marker)):
            names.append(entry["name"])
    return names


class FilterModule:
    def filters(self):
        return {
            "ddtree_patchset_fingerprint": ddtree_patchset_fingerprint,
            "ddtree_patch_plan": ddtree_patch_plan,
            "ddtree_patch_series": ddtree_patch_series,
            "ddtree_patches_adding": ddtree_patches_adding,
        }
