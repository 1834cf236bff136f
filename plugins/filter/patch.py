# -*- coding: utf-8 -*-
"""Controller-side filters for the DDTREE patch set.

The logic lives in ``module_utils/ddtree_patch.py``, the file the ``sglang_patch`` module ships
to the hosts, so the fingerprint in venv paths and the one in a host's stamp come from one
implementation.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch


def _call(name, func, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except ddtree_patch.PatchSetError as exc:
        raise AnsibleFilterError("%s: %s" % (name, exc)) from exc


def patchset_fingerprint(entries, length=None):
    """Short fingerprint of a list of ``{"name", "sha256"}`` (``nopatch`` if empty)."""
    kwargs = {} if length is None else {"length": int(length)}
    return _call("patchset_fingerprint", ddtree_patch.patchset_fingerprint, entries, **kwargs)


def patch_plan(series_text, sums_text, selected, extras, patch_dir):
    """The patch set to apply, ``[{"name", "src", "sha256"}]``: the selected built-ins in series
    order, then the user's patches (``sglang_patches``, ``sglang_extra_patches``)."""
    return _call("patch_plan", ddtree_patch.select_patches, str(series_text), str(sums_text),
                 selected, extras, str(patch_dir))


def patch_series(series_text):
    """The patch names of a ``series`` file, in order (the strict parser of the patch plan)."""
    return _call("patch_series", ddtree_patch.parse_series, str(series_text))


def patches_adding(plan, target, marker):
    """Names of the patches in ``plan`` (``patch_plan``'s entries, read from their ``src``
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
        if _call("patches_adding: %s" % entry.get("name"), ddtree_patch.patch_adds,
                 text, str(target), str(marker)):
            names.append(entry["name"])
    return names


class FilterModule:
    def filters(self):
        return {
            "patchset_fingerprint": patchset_fingerprint,
            "patch_plan": patch_plan,
            "patch_series": patch_series,
            "patches_adding": patches_adding,
        }
