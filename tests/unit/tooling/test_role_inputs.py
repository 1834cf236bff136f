"""A role reads another role's variables only through a declared dependency or as a documented input.

Every name a role's tasks, handlers, templates, defaults and vars use that carries another role's
prefix (sglang_service_name in known_good, say) must either belong to a role it depends on in
meta/main.yml (directly or through those roles' own dependencies), or be named as C(name) in the
descriptions of the role's meta/argument_specs.yml, where ansible-doc shows it. A newcomer then
sees every piece of data a role takes from elsewhere, and a new hidden coupling fails here.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = REPO / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "meta" / "main.yml").exists())
MODULE_NAMES = {p.stem for p in (REPO / "plugins" / "modules").glob("*.py")}
SCANNED = ("tasks", "handlers", "templates", "defaults", "vars")
WORD = re.compile(r"\b[a-z][a-z0-9_]*\b")
MARKUP = re.compile(r"C\(([a-z][a-z0-9_]*)\)")


def owner(name: str) -> str | None:
    """The role whose prefix the name carries (the longest: sglang_service_x is sglang_service's)."""
    matches = [r for r in ROLE_NAMES if name.startswith(r + "_")]
    return max(matches, key=len) if matches else None


def dependencies(role: str, seen: set[str] | None = None) -> set[str]:
    seen = set() if seen is None else seen
    meta = yaml.safe_load((ROLES / role / "meta" / "main.yml").read_text()) or {}
    for dep in meta.get("dependencies") or []:
        name = (dep if isinstance(dep, str) else dep.get("role") or dep.get("name")).removeprefix("ddtree.fleet.")
        if name not in seen:
            seen.add(name)
            dependencies(name, seen)
    return seen


def documented_inputs(role: str) -> set[str]:
    path = ROLES / role / "meta" / "argument_specs.yml"
    if not path.exists():
        return set()
    specs = (yaml.safe_load(path.read_text()) or {}).get("argument_specs") or {}
    out = set()
    for entry in specs.values():
        text = entry.get("description") or []
        for line in [text] if isinstance(text, str) else text:
            out.update(MARKUP.findall(line))
    return out


def foreign_reads(role: str) -> dict[str, set[str]]:
    """{name: files} of the names with another role's prefix that the role's files use."""
    out: dict[str, set[str]] = {}
    for sub in SCANNED:
        for path in sorted((ROLES / role / sub).rglob("*")):
            if not path.is_file():
                continue
            for name in set(WORD.findall(path.read_text(errors="replace"))):
                if name in MODULE_NAMES or name in ROLE_NAMES:
                    continue
                who = owner(name)
                if who is not None and who != role:
                    out.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return out


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_foreign_variables_come_from_a_dependency_or_are_documented_inputs(role):
    deps = dependencies(role)
    documented = documented_inputs(role)
    hidden = {name: sorted(files) for name, files in foreign_reads(role).items()
              if owner(name) not in deps and name not in documented}
    assert not hidden, (
        f"role {role} reads variables of roles it does not depend on ({', '.join(sorted(deps)) or 'none'}) "
        f"without naming them as C(name) in roles/{role}/meta/argument_specs.yml: {hidden}")


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_documented_inputs_are_read_and_foreign(role):
    """No stale entries: every documented input is another role's name that this role really uses."""
    reads = foreign_reads(role)
    stale = sorted(name for name in documented_inputs(role)
                   if owner(name) not in (None, role) and name not in reads)
    assert not stale, f"roles/{role}/meta/argument_specs.yml documents inputs it no longer reads: {stale}"


def test_the_checker_sees_a_foreign_read():
    """Names go to the longest role prefix, and the scan finds a known foreign read in a handler."""
    assert owner("sglang_service_name") == "sglang_service"
    assert owner("sglang_config_venv") == "sglang"
    assert owner("drift_timer_user") == "drift_timer"
    assert owner("ddtree_run_id") is None
    reads = foreign_reads("known_good")
    assert "sglang_service_name" in reads    # the restore handlers restart the service by name
