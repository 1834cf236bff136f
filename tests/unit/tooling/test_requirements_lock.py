"""requirements.lock: the controller toolchain, every package pinned with its sha256 (make venv
installs it with --require-hashes --no-deps), generated from requirements.txt by make lock."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(path, seen=None):
    """{name: version} of requirements.txt and the files it includes (-r)."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            out.update(declared(path.parent / line[3:].strip()))
        elif line:
            m = PIN.match(line)
            assert m, f"{path.name}: not an exact pin: {raw!r}"
            out[norm(m.group(1))] = m.group(2)
    return out


def locked():
    """{name: (version, [hashes])} of requirements.lock."""
    out, current = {}, None
    for line in (REPO / "requirements.lock").read_text().splitlines():
        m = PIN.match(line)
        if m:
            current = norm(m.group(1))
            out[current] = (m.group(2), [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            out[current][1].append(digest)
    return out


def test_every_declared_pin_is_locked_at_its_version():
    lock = locked()
    wanted = declared(REPO / "requirements.txt")
    assert len(wanted) >= 20
    wrong = {name: (version, lock.get(name, ("missing",))[0]) for name, version in wanted.items()
             if lock.get(name, (None,))[0] != version}
    assert not wrong, f"requirements.txt and requirements.lock disagree (run make lock): {wrong}"


def test_every_locked_package_has_a_hash_and_the_lock_names_no_index():
    lock = locked()
    assert len(lock) > len(declared(REPO / "requirements.txt"))   # the dependencies are locked too
    assert not [name for name, (_, hashes) in lock.items() if not hashes]
    text = (REPO / "requirements.lock").read_text()
    assert not re.search(r"^\s*--(extra-)?index-url|^\s*--find-links|file://", text, re.M)


def test_this_venv_is_the_lock():
    """The venv the tests run in was installed from the lock (make venv): same versions."""
    drift = {}
    for name, (version, _) in locked().items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != version:
            drift[name] = (version, have)
    assert not drift, f"the venv differs from requirements.lock (rm -r .venv && make venv): {drift}"
