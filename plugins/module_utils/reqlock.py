# -*- coding: utf-8 -*-
# ddtree-fleet: the host venv's hash lock (pip-compile --generate-hashes output), read and checked.
#
# Used by role sglang through the filter ddtree.fleet.requirements_lock and by the unit tests;
# pure logic, controller side. pip itself enforces the hashes at install time (--require-hashes);
# this module refuses, before any host changes, a lock that could not be installed that way or
# that would install something else than the declared settings say.

from __future__ import annotations

import re

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")
_PYTHON = re.compile(r"^#.*\bwith Python (\d+\.\d+)\b", re.M)


def canonical(name):
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def _logical_lines(text):
    """Requirement lines with their backslash continuations joined, comments dropped."""
    out, cur = [], ""
    for raw in str(text).splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        if cur.strip():
            out.append(cur.strip())
        cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


def parse(text):
    """{pins: {name: version}, hashes: {name: count}, python: 'X.Y' or None, problems: [...]}."""
    pins, hashes, problems = {}, {}, []
    for line in _logical_lines(text):
        if line.startswith("-"):
            problems.append("option line %r (a lock holds pinned requirements only)" % line[:60])
            continue
        m = _PIN.match(line)
        if not m:
            problems.append("%r is not pinned with == (every requirement of a lock is)" % line[:60])
            continue
        name = canonical(m.group(1))
        found = _HASH.findall(line)
        if not found:
            problems.append("%s==%s has no --hash=sha256 (pip --require-hashes refuses it)" % (name, m.group(3)))
        pins[name] = m.group(3)
        hashes[name] = len(found)
    if not pins and not problems:
        problems.append("no requirement in it")
    py = _PYTHON.search(str(text))
    return {"pins": pins, "hashes": hashes, "python": py.group(1) if py else None, "problems": problems}


def requirement_pin(requirement):
    """'name==version' (an extra package) -> (canonical name, version); (name, None) if unpinned."""
    m = _PIN.match(str(requirement).strip())
    if m:
        return canonical(m.group(1)), m.group(3)
    return canonical(re.split(r"[<>=!~ \[;@]", str(requirement).strip(), maxsplit=1)[0]), None


def problems(text, path, version, extra_packages, source_type):
    """What is wrong with the lock for these settings, one sentence each naming the variable."""
    where = "sglang_requirements_lock=%s" % path
    if not path:
        return []
    if source_type != "pypi":
        return ["%s with sglang_source type %s: pip cannot hash-check a VCS checkout; expected "
                "sglang_requirements_lock: '' for a git source." % (where, source_type)]
    if not str(text or "").strip():
        return ["%s is missing or empty on the controller; expected a lock made by `make host-lock` "
                "(pip-compile --generate-hashes), or sglang_requirements_lock: '' to install unlocked." % where]
    lock = parse(text)
    out = ["%s: %s." % (where, p) for p in lock["problems"][:5]]
    pinned = lock["pins"].get("sglang")
    if pinned != str(version):
        out.append("%s pins sglang==%s, but sglang_version is %s; expected a lock for sglang %s." % (
            where, pinned or "(nothing)", version, version))
    for req in extra_packages or []:
        name, want = requirement_pin(req)
        have = lock["pins"].get(name)
        if have is None or (want is not None and have != want):
            out.append("%s does not pin %s (sglang_extra_packages); with --require-hashes every package "
                       "must be in the lock: expected it pinned%s." % (
                           where, req, (" at " + want) if want else ""))
    return out
