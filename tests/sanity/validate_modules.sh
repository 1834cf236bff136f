#!/usr/bin/env bash
# ddtree-fleet: run ansible-core's own module checker (ansible-test sanity --test validate-modules)
# over the collection ddtree.fleet as it ships: `ansible-galaxy collection build` of this checkout,
# installed into a temporary ansible_collections tree, so the checker imports the modules, their
# module_utils and action plugin exactly as an installed collection has them (no fallback to
# sys.path or to this tree's ansible.cfg: ANSIBLE_* settings are cleared).
#
# The project keeps its own licence: the only check suppressed is validate-modules'
# missing-gplv3-license (GPL header), via an ignore file written in the temporary collection for
# the modules that have no such header. Nothing else is ignored.
#
# ansible-test runs validate-modules in a sanity virtualenv of its own, with the requirements it
# pins (voluptuous, antsibull-docs-parser, ...), installed from PyPI on the first run and reused
# afterwards. It keeps that virtualenv under ~/.ansible/test; HOME is pointed at
# $ANSIBLE_TEST_HOME (default .ansible/ansible-test-home, git-ignored) so the project's copy stays
# out of the user's home. To put pip into that virtualenv, ansible-test downloads a get-pip.py
# from ci-files.testing.ansible.com (not reachable from here); its documented way out is a cached
# bootstrap script, so this script caches a stand-in that installs the same pip version from its
# PyPI wheel. Nothing else about the check changes.
#
# Usage: tests/sanity/validate_modules.sh [extra ansible-test arguments]   (exit status 0 = clean)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ANSIBLE_TEST=${ANSIBLE_TEST:-$ROOT/.venv/bin/ansible-test}
VENV_PY=$(dirname "$ANSIBLE_TEST")/python
ANSIBLE_TEST_HOME=${ANSIBLE_TEST_HOME:-$ROOT/.ansible/ansible-test-home}
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
NS=ddtree
NAME=fleet

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddtree-validate-modules.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
coll=$tmp/ansible_collections/$NS/$NAME

# The collection as users get it: built from galaxy.yml (its build_ignore applies) and installed.
env -u ANSIBLE_CONFIG "$(dirname "$ANSIBLE_TEST")/ansible-galaxy" collection build --output-path "$tmp" "$ROOT" >/dev/null
env -u ANSIBLE_CONFIG "$(dirname "$ANSIBLE_TEST")/ansible-galaxy" collection install --force --no-deps -p "$tmp" \
    "$tmp/$NS-$NAME-"*.tar.gz >/dev/null
mkdir -p "$coll/tests/sanity"

# The one suppressed check: the GPLv3 header (the project has its own licence).
core_version=$("$ROOT/.venv/bin/python" -c \
    'from ansible.release import __version__ as v; print(".".join(v.split(".")[:2]))')
ignore=$coll/tests/sanity/ignore-$core_version.txt
: > "$ignore"
for m in "$coll"/plugins/modules/*.py; do
    if ! head -n 20 "$m" | grep -q 'GNU General Public License'; then
        echo "plugins/modules/$(basename "$m") validate-modules:missing-gplv3-license" >> "$ignore"
    fi
done

# The pip bootstrap stand-in (see the top of this file), made once per pip version.
pip_version=$("$VENV_PY" -c 'import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="'"$PYTHON_VERSION"'"))["pip"])')
at_cache=$ANSIBLE_TEST_HOME/.ansible/test/cache
get_pip=$at_cache/get_pip_${pip_version//./_}.py
if [ ! -f "$get_pip" ]; then
    mkdir -p "$at_cache"
    "$VENV_PY" -m pip download -q --no-deps --only-binary :all: -d "$at_cache" "pip==$pip_version"
    wheel=$at_cache/pip-$pip_version-py3-none-any.whl
    [ -f "$wheel" ] || { echo "validate_modules.sh: no $wheel" >&2; exit 2; }
    cat > "$get_pip.tmp" <<PY
# Stand-in for get-pip.py $pip_version, written by ddtree-fleet's tests/sanity/validate_modules.sh:
# installs pip from its PyPI wheel (ansible-test passes get-pip's options and packages).
import sys
sys.path.insert(0, "$wheel")
from pip._internal.cli.main import main
sys.exit(main(["install"] + [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]))
PY
    mv "$get_pip.tmp" "$get_pip"
fi

# ansible-test writes its results under the collection's tests/output (in $tmp). Clear the
# project's Ansible settings so that nothing outside the temporary collection is importable.
cd "$coll"
rc=0
env -u ANSIBLE_CONFIG -u ANSIBLE_COLLECTIONS_PATH -u ANSIBLE_LIBRARY -u ANSIBLE_MODULE_UTILS \
    -u ANSIBLE_ACTION_PLUGINS -u ANSIBLE_HOME -u PYTHONPATH HOME="$ANSIBLE_TEST_HOME" \
    "$ANSIBLE_TEST" sanity --test validate-modules --python "$PYTHON_VERSION" --color no "$@" 2>&1 || rc=$?
if [ "$rc" -eq 0 ]; then
    echo "validate-modules: all modules pass"
fi
exit "$rc"
