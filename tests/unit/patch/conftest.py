"""Fixtures for the patch-set unit tests (plugins/module_utils/patch/series.py, sglang_patch, filters).

Synthetic site-packages trees under tmp_path; GNU patch must be installed.
"""

from __future__ import annotations

import shutil
import sys

import pytest


from patchset_testlib import Tree  # noqa: E402  (also puts module_utils on sys.path)

if shutil.which("patch") is None:  # pragma: no cover - environment problem
    pytest.exit("GNU patch is required for tests/unit/patch (apt-get install patch)", returncode=4)


@pytest.fixture
def tree(tmp_path):
    return Tree(tmp_path)


@pytest.fixture(scope="session")
def logic():
    from ansible_collections.ddtree.fleet.plugins.module_utils.patch import series as ddtree_patch

    return ddtree_patch
