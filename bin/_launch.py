"""Shared by the bin/ launchers: run one of ddtree.fleet's controller CLIs.

The CLIs live in the collection (plugins/plugin_utils/cli/); these launchers only find the
directory that holds ``ansible_collections`` -- the checkout's collections/ (whose
ddtree/fleet link points back at the checkout) or, in an installed collection, the directory
three levels above it -- and re-execute the same interpreter with it on PYTHONPATH.
"""

import os
import sys


def collections_root(bin_dir):
    fleet = os.path.dirname(os.path.realpath(bin_dir))
    checkout = os.path.join(fleet, "collections")
    if os.path.isdir(os.path.join(checkout, "ansible_collections", "ddtree", "fleet")):
        return checkout
    return os.path.dirname(os.path.dirname(os.path.dirname(fleet)))


def run(script, cli):
    bin_dir = os.path.dirname(os.path.realpath(script))
    root = collections_root(bin_dir)
    path = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    module = "ansible_collections.ddtree.fleet.plugins.plugin_utils.cli." + cli
    os.execve(sys.executable, [sys.executable, "-m", module] + sys.argv[1:], env)
