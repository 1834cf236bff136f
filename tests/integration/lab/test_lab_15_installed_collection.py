"""The collection as an operator installs it: built from this checkout, installed into a fresh
venv that has nothing but the pinned ansible-core, run by FQCN against the lab.

Nothing of the checkout is used at run time: a working directory outside it, an ansible.cfg of
the operator's own (the project's settings less its inventory, collection and home paths), the
installed directory as the only collections path. Only the lab inventory comes from the lab (an
operator's inventory). The run is the incident itself, `ansible-playbook ddtree.fleet.deploy_ddtree
-l ct129`: the fleet's DDTREE (the collection's own group_vars/all.yml; its group_vars/sm86.yml
gives the A6000's memory fraction) fails the gate on sm86 and the host is rolled back to its
known-good NEXTN, restored byte for byte and probed; the report and the evidence go under the
working directory's artifacts/ (ddtree_artifacts_dir's default), not inside the collection.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import labkit
import pytest

REQUIREMENTS = labkit.REPO / "requirements.txt"


def _pin(name: str) -> str:
    line = next(x for x in REQUIREMENTS.read_text().splitlines() if x.lower().startswith(name + "=="))
    return line.split()[0]


@pytest.fixture(scope="module")
def installed(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", _pin("ansible-core")],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env.update(PATH=f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", ANSIBLE_NOCOLOR="1")
    build = subprocess.run([str(venv / "bin" / "ansible-galaxy"), "collection", "build", "--output-path",
                            str(root), str(labkit.REPO)], cwd=root, env=env, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = root.glob("ddtree-fleet-*.tar.gz")
    inst = subprocess.run([str(venv / "bin" / "ansible-galaxy"), "collection", "install", "--no-deps", "-p",
                           str(root / "collections"), str(tarball)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    # The operator's ansible.cfg: the project's settings (precedence, pipelining, ...), with the
    # installed collections instead of the checkout's link, and a home of its own.
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(labkit.REPO / "ansible.cfg")
    for key in ("inventory", "collections_path", "home", "fact_caching_connection", "local_tmp"):
        cfg.remove_option("defaults", key)
    cfg.set("defaults", "collections_path", str(root / "collections"))
    cfg.set("defaults", "home", str(root / "home"))
    cfg.set("defaults", "fact_caching_connection", str(root / "facts"))
    cfg.set("defaults", "local_tmp", str(root / "tmp"))
    work = root / "ops"
    work.mkdir()
    with open(work / "ansible.cfg", "w") as fh:
        cfg.write(fh)
    env["ANSIBLE_CONFIG"] = str(work / "ansible.cfg")
    return {"root": root, "venv": venv, "work": work, "env": env}


def test_the_installed_collection_runs_the_incident_on_the_lab_from_a_fresh_venv(installed):
    work, env = installed["work"], installed["env"]
    kg = labkit.known_good("ct129")
    argv = [str(installed["venv"] / "bin" / "ansible-playbook"), "-i", str(labkit.INVENTORY),
            "ddtree.fleet.deploy_ddtree", "-l", "ct129"]
    started = time.monotonic()
    res = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    out = res.stdout + res.stderr
    assert res.returncode == 2, out[-4000:]
    assert "the DDTREE change failed" in out and "restored, healthy and probed" in out, out[-3000:]
    # Every role and module came from the installed collection, none from the checkout.
    for part in ("roles", "collections", "plugins", "playbooks"):
        assert str(labkit.REPO / part) not in out, f"the run used {labkit.REPO / part}"
    # Slot 0 has the default (artifacts/ where the run started); a lab slot's inventory points
    # ddtree_artifacts_dir at artifacts/lab-slot<k> (labctl), as an operator's inventory may.
    outputs = labkit.ARTIFACTS if labkit.SLOT else work / "artifacts"
    report = json.loads((outputs / "deploy" / "latest.json").read_text())
    (entry,) = report["hosts"]
    assert (entry["host"], entry["outcome"]) == ("ct129", "rolled_back"), report
    evidence = Path(entry["evidence"])
    assert evidence.parent == outputs / "ct129" and (evidence / "unit.diff").is_file(), evidence
    # The collection's own group_vars/sm86.yml applied (the role defaults would give tp 1).
    assert "--tp-size 2" in (evidence / "unit.diff").read_text()
    assert not list((installed["root"] / "collections").rglob("artifacts")), "wrote inside the collection"
    now = labkit.known_good("ct129")
    assert now["link"] == kg["link"] and now["unit_sha256"] == kg["unit_sha256"], (kg, now)
    assert labkit.service("ct129")["ActiveState"] == "active"
    labkit.record_timing("installed collection (fresh venv): ct129 DDTREE refused and rolled back",
                         play_wall=round(seconds, 2))
