"""execution-environment.yml renders with ansible-builder, and carries the toolchain CI tests.

Building the image needs a container engine (these machines have none); `ansible-builder create`
renders the whole build context without one, which is what AWX's image build starts from.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
BUILDER = Path(sys.executable).with_name("ansible-builder")


def pins(path):
    """name -> version of the ``name==version`` lines of a requirements file (its -r files included)."""
    out = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            out.update(pins(Path(path).parent / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    if not BUILDER.exists():
        pytest.fail("ansible-builder is not in the venv (requirements.txt pins it): %s" % BUILDER)
    out = tmp_path_factory.mktemp("ee") / "context"
    proc = subprocess.run(
        [str(BUILDER), "create", "-f", "execution-environment.yml", "-c", str(out), "--output-filename", "Containerfile"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_context_is_rendered_from_the_definition(context):
    definition = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="%s"' % definition["images"]["base_image"]["name"] in containerfile
    assert 'ARG PYCMD="/usr/bin/python3.11"' in containerfile
    # the builder stage introspects our pip and bindep lists; the final stage checks ansible
    assert "introspect.py introspect --user-pip=requirements.txt --user-bindep=bindep.txt" in containerfile
    assert "check_ansible" in containerfile
    assert (context / "_build" / "scripts" / "assemble").exists()


def test_image_carries_the_pins_ci_tests(context):
    """ansible-core, ansible-runner and every controller package: the versions requirements.txt installs."""
    tested = pins(REPO / "requirements.txt")
    refs = re.search(r'ARG ANSIBLE_INSTALL_REFS="([^"]+)"', (context / "Containerfile").read_text()).group(1).split()
    assert sorted(refs) == sorted(["ansible-core==" + tested["ansible-core"], "ansible-runner==" + tested["ansible-runner"]])
    in_image = pins(context / "_build" / "requirements.txt")
    assert in_image == pins(REPO / "ee" / "requirements.txt")
    assert in_image and all(tested[name] == version for name, version in in_image.items())


def test_venv_runs_the_pinned_versions():
    """The toolchain the tests ran with is the one the image would hold (no unpinned drift)."""
    for name, version in pins(REPO / "ee" / "requirements.txt").items():
        assert metadata.version(name) == version, name
    assert metadata.version("ansible-core") == pins(REPO / "requirements.txt")["ansible-core"]
    assert metadata.version("ansible-runner") == pins(REPO / "requirements.txt")["ansible-runner"]


def test_bindep_names_the_ssh_client_and_patch(context):
    bindep = (context / "_build" / "bindep.txt").read_text()
    assert re.search(r"^openssh-clients \[platform:rpm\]", bindep, re.M)
    assert re.search(r"^patch ", bindep, re.M)

