"""Every role entry point that is entered has an argument spec; every argument spec is entered.

Read statically from the playbooks, the roles' task and handler files and their meta
dependencies (a dependency enters the role's main tasks): import_role / include_role name and
tasks_from (default main), and `roles:` entries. Molecule's own test roles are out of scope.
"""

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLE_KEYS = {"ansible.builtin.import_role", "ansible.builtin.include_role", "import_role", "include_role"}


def _yaml_files():
    yield from REPO.glob("*.yml")
    yield from (REPO / "playbooks").rglob("*.yml")
    for sub in ("tasks", "handlers"):
        yield from (REPO / "roles").glob(f"*/{sub}/*.yml")


def _entered(node, found):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ROLE_KEYS and isinstance(value, dict):
                found.add((value["name"], value.get("tasks_from", "main")))
            elif key == "roles" and isinstance(value, list):
                for item in value:
                    name = item.get("role") if isinstance(item, dict) else item
                    found.add((name, "main"))
            _entered(value, found)
    elif isinstance(node, list):
        for item in node:
            _entered(item, found)


COLLECTION = "ddtree.fleet."


def _entered_by_name():
    found = set()
    for path in _yaml_files():
        _entered(yaml.safe_load(path.read_text()), found)
    for meta in (REPO / "roles").glob("*/meta/main.yml"):
        for dep in yaml.safe_load(meta.read_text()).get("dependencies") or []:
            found.add((dep["role"] if isinstance(dep, dict) else dep, "main"))
    return found


@pytest.fixture(scope="module")
def entered():
    return {(name.removeprefix(COLLECTION), entry) for name, entry in _entered_by_name()}


def test_roles_are_entered_by_their_fqcn():
    """The checkout has no roles_path: a role named without ddtree.fleet. would not be found
    (and in an installed collection would not be this one)."""
    short = sorted(name for name, _ in _entered_by_name() if not name.startswith(COLLECTION))
    assert short == []


@pytest.fixture(scope="module")
def specs():
    out = set()
    for path in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(path.read_text())["argument_specs"]:
            out.add((path.parts[-3], entry))
    return out


def test_every_entered_entry_point_has_an_argument_spec(entered, specs):
    # A role entered only as a dependency may have no main tasks (and then no main spec).
    missing = sorted(f"{r}:{e}" for r, e in entered - specs
                     if (REPO / "roles" / r / "tasks" / f"{e}.yml").is_file())
    assert not missing, f"entered without an argument spec: {missing}"


def test_every_argument_spec_is_entered_and_has_its_tasks(entered, specs):
    unused = sorted(f"{r}:{e}" for r, e in specs - entered)
    assert not unused, f"argument specs of entry points nothing enters (remove them, or their tasks): {unused}"
    no_tasks = sorted(f"{r}:{e}" for r, e in specs if not (REPO / "roles" / r / "tasks" / f"{e}.yml").is_file())
    assert not no_tasks, f"argument specs without a tasks file: {no_tasks}"


def test_the_scan_sees_the_stages(entered):
    # Guards the scan itself: the one gated-change path enters these.
    for ref in [("sglang_service", "change"), ("known_good", "arm"), ("quality_gate", "main"),
                ("benchmark", "measure"), ("sglang", "main")]:
        assert ref in entered, ref
