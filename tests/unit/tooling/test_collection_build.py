"""The collection as users get it: `ansible-galaxy collection build` of this checkout, installed
into a directory of its own, runs its entry points by FQCN with nothing from the checkout.

The run is hermetic: an empty ansible.cfg, the installed directory as the only collections path,
a working directory outside the checkout (so neither the repo's ansible.cfg nor its
collections/ link can be what resolves the names).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ENTRY_POINTS = ("deploy_ddtree", "drift", "benchmark", "drift_timer", "converge")
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))


def _bin(name):
    return str(Path(sys.executable).with_name(name))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("collection")
    cfg = root / "ansible.cfg"
    cfg.write_text("[defaults]\ncollections_scan_sys_path = false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(cfg), ANSIBLE_HOME=str(root / "home"), ANSIBLE_LOCAL_TEMP=str(root / "tmp"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0")
    build = subprocess.run([_bin("ansible-galaxy"), "collection", "build", "--output-path", str(root), str(REPO)],
                           cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = root.glob("ddtree-fleet-*.tar.gz")
    dest = root / "installed"
    inst = subprocess.run([_bin("ansible-galaxy"), "collection", "install", "--no-deps", "--force",
                           "-p", str(dest), str(tarball)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    env["ANSIBLE_COLLECTIONS_PATH"] = str(dest)
    (root / "hosts.ini").write_text("[sglang_servers]\nct1 ansible_connection=local\n")
    return {"root": root, "tarball": tarball, "dest": dest, "env": env}


def test_the_artifact_ships_the_product_and_not_the_lab(installed):
    with tarfile.open(installed["tarball"]) as tar:
        names = set(tar.getnames())
    for wanted in ("MANIFEST.json", "FILES.json", "meta/runtime.yml", "playbooks/deploy_ddtree.yml",
                   "roles/known_good/meta/argument_specs.yml", "plugins/module_utils/probe/run.py",
                   "plugins/action/sglang_probe.py", "plugins/filter/patch.py",
                   # the per-architecture vars, next to the collection's playbooks (a real directory:
                   # a build drops a link to a directory, and the fleet would lose its settings)
                   "playbooks/group_vars/all.yml", "playbooks/group_vars/sm86.yml",
                   "roles/validate_inputs/meta/argument_specs.yml", "roles/run_report/tasks/main.yml"):
        assert wanted in names, wanted
    assert not [n for n in names if n.split("/")[0] in ("lab", "collections", "inventory", "molecule", ".ci")]
    assert not [n for n in names if n.startswith(("tests/integration", "tests/bench", "tests/real"))]


def test_no_product_file_edits_sys_path(installed):
    coll = installed["dest"] / "ansible_collections" / "ddtree" / "fleet"
    offenders = [str(p.relative_to(coll)) for p in (coll / "plugins").rglob("*.py")
                 if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()]
    assert offenders == []


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_each_entry_point_resolves_by_fqcn_from_the_installed_collection(installed, entry):
    proc = subprocess.run([_bin("ansible-playbook"), "-i", "hosts.ini", "--syntax-check", f"ddtree.fleet.{entry}"],
                          cwd=installed["root"], env=installed["env"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "playbook: " in proc.stdout


def test_a_name_the_collection_does_not_have_is_refused(installed):
    proc = subprocess.run([_bin("ansible-playbook"), "-i", "hosts.ini", "--syntax-check", "ddtree.fleet.no_such_entry"],
                          cwd=installed["root"], env=installed["env"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode != 0
    assert "no_such_entry" in proc.stdout + proc.stderr


def test_every_module_has_its_documentation_in_the_installed_collection(installed):
    proc = subprocess.run([_bin("ansible-doc"), "-t", "module", "--json", *(f"ddtree.fleet.{m}" for m in MODULES)],
                          cwd=installed["root"], env=installed["env"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    docs = json.loads(proc.stdout)
    assert sorted(docs) == [f"ddtree.fleet.{m}" for m in MODULES]
    for name, doc in docs.items():
        assert doc["doc"]["short_description"] and doc["examples"] and doc["return"], name


def test_the_installed_cli_launcher_finds_its_collection(installed):
    coll = installed["dest"] / "ansible_collections" / "ddtree" / "fleet"
    env = {k: v for k, v in installed["env"].items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(coll / "bin" / "ddtree-probe"), "assess", "-"],
                          input='{"id": "a", "prompt": "2+2?", "output": "4"}\n', cwd=installed["root"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert '"verdict": "ok"' in proc.stdout
