# -*- coding: utf-8 -*-
"""Filters for the host venv's hash lock (logic: plugins/module_utils/reqlock.py)."""
from __future__ import annotations

from ansible_collections.ddtree.fleet.plugins.module_utils import reqlock


def requirements_lock_problems(text, path, version, extra_packages, source_type):
    """Problems of the lock for these settings (empty: it can be installed with --require-hashes)."""
    return reqlock.problems(text, str(path or ""), str(version), list(extra_packages or []), str(source_type))


def requirements_lock_python(text):
    """The Python version the lock was compiled with ('X.Y'), or '' when its header does not say."""
    return reqlock.parse(text)["python"] or ""


class FilterModule:
    def filters(self):
        return {
            "requirements_lock_problems": requirements_lock_problems,
            "requirements_lock_python": requirements_lock_python,
        }
