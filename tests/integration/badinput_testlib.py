"""Helpers of test_bad_input_matrix.py: cases generated from every role's argument spec, a
throwaway inventory in which every case is its own host alias, the run's JSON results, and a
byte-for-byte snapshot of the test's own lab host.

Cases come from roles/*/meta/argument_specs.yml (every role, every entry point, every option and
sub-option; the playbooks' own knobs are role validate_inputs' options): wrong types from each
option's ``type``/``elements`` (including the values Ansible's argument-spec validation converts
silently) and out-of-range values from ``choices`` and the ``Limits:`` line of its description.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import labkit  # tests/integration/lab/labkit.py: one environment for ansible-playbook
from ansible_collections.ddtree.fleet.plugins.filter.inputs import spec_limits

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
LAB_STATE = Path(os.environ.get("DDTREE_LAB_STATE", "/var/lib/ddtree-lab"))
SSH_KEY = LAB_STATE / "ssh" / "id_ed25519"
KNOWN_HOSTS = LAB_STATE / "ssh" / "known_hosts"
FLEET_FILE = Path(__file__).resolve().parent / "badinput_fleet.json"
VALIDATE_INPUTS = REPO / "roles" / "validate_inputs"
# The option the playbook itself sets when it imports validate_inputs (not an operator input).
INTERNAL = {"validate_inputs_for"}
PLUGINS = Path(__file__).resolve().parent / "badinput_plugins"

# playbook -> (file run for the matrix, name of its first play, task names of the input checks)
PLAYBOOKS = {
    "converge": "playbooks/converge.yml",
    "benchmark": "playbooks/benchmark.yml",
    "drift_timer": "playbooks/drift_timer.yml",
}
# Role validate_inputs' tasks, as the json callback names them (role FQCN, " : ", task name).
VALIDATION_TASKS = {"ddtree.fleet.validate_inputs : " + name for name in (
    "Load the argument specs of the entry points this playbook reaches (once)",
    "Check types and ranges of every input (no silent conversion)",
    "Validate every entry point's argument spec as the role will when it is entered",
    "Check that ddtree_canary is one of the targeted hosts",
    "Check that every name in -l and ddtree_hosts is a host or group of the inventory",
)}

# Wrong-type values per argument-spec type. Several of them pass Ansible's own argument-spec
# validation by silent conversion ("a,b" -> [a, b], "a=1" -> {a: 1}, a mapping -> its repr for
# str, true -> 1 for int/float); the roles' up-front checks must still refuse them.
WRONG_TYPE = {
    "int": ["abc", True, 1.5],
    "float": ["abc", True, "nan"],
    "bool": ["maybe"],
    "str": [{"bad": 1}, ["bad"]],
    "path": [{"bad": 1}, ["/bad"]],
    "list": ["a,b", {"bad": 1}],
    "dict": ["a=1", ["bad"]],
}
WRONG_ELEMENT = {"str": {"bad": 1}, "path": {"bad": 1}, "int": "x", "float": "x", "bool": "maybe",
                 "dict": "x", "list": "x"}
# Per-option overrides of the derived bad values: option -> extra (kind, value) cases.
OVERRIDES: dict[str, list[tuple[str, object]]] = {
    "sglang_mem_fraction_static": [("range", 1.5), ("range", -0.1)],
    "sglang_port": [("range", 70000)],
}
# Knobs that choose the play's hosts: a host var cannot set them, each case is its own -e run.
EXTRA_VARS_ONLY = {"ddtree_controllers"}
PATTERN_CANDIDATES = ["not valid!", "", "x y", "relative/path", "0", "/abs"]


@dataclass
class Case:
    option: str                 # option name; sub-options as option.key
    kind: str                   # type | range | input (explicit bad input outside the specs)
    value: object               # the bad value (for sub-options: of the sub-option)
    playbook: str               # converge | benchmark | drift_timer
    hostvars: dict = field(default_factory=dict)
    groups: tuple = ("sm86",)
    expect: tuple = ()          # regexes the failure message must match
    stage: str = "validate"     # validate: the input checks; preflight: the preflight play's roles
    alias: str = ""
    extra_vars: bool = False    # the playbook reads it before any host var exists: -e in its own run


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def role_specs() -> dict[str, dict[str, dict]]:
    """role -> entry point -> options, for every roles/*/meta/argument_specs.yml."""
    out = {}
    for path in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        data = load_yaml(path)["argument_specs"]
        out[path.parent.parent.name] = {ep: (spec or {}).get("options") or {} for ep, spec in data.items()}
    return out


def entry_points() -> dict[str, list[str]]:
    """playbook -> the "role:entry point" refs it validates up front (role validate_inputs)."""
    return load_yaml(VALIDATE_INPUTS / "vars" / "main.yml")["validate_inputs_entry_points"]


def declared_value(name: str):
    """The fleet's value of an option: group_vars/all.yml, else the role defaults that hold it."""
    gv = load_yaml(REPO / "group_vars" / "all.yml") or {}
    if name in gv:
        return copy.deepcopy(gv[name])
    for path in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        data = load_yaml(path) or {}
        if name in data:
            return copy.deepcopy(data[name])
    return None


def option_table() -> dict[str, tuple[dict, str]]:
    """option -> (spec, playbook that validates it first), for every option of every entry point."""
    eps = entry_points()
    specs = role_specs()
    table: dict[str, tuple[dict, str]] = {}
    for name, spec in specs.pop("validate_inputs")["main"].items():
        if name not in INTERNAL:
            table[name] = (spec, "drift_timer" if name == "ddtree_controllers" else "converge")
    for role, entries in specs.items():
        for ep, options in entries.items():
            ref = f"{role}:{ep}"
            playbook = next((pb for pb in PLAYBOOKS if ref in eps.get(pb, [])), None)
            for name, spec in options.items():
                if name not in table or (playbook and table[name][1] is None):
                    table[name] = (spec, playbook)
    return table


def _bad_scalar_for_limits(wanted: str, limits: dict) -> list[object]:
    out: list[object] = []
    step = 1 if wanted == "int" else 0.5
    if "min" in limits:
        out.append(limits["min"] - step)
    if "max" in limits:
        out.append(limits["max"] + step)
    if "gt" in limits:
        out.append(limits["gt"])
    if "lt" in limits:
        out.append(limits["lt"])
    if "choices" in limits:
        out.append("NOSUCH")
    if limits.get("nonempty"):
        out.append("")
    if limits.get("absolute"):
        out.append("relative/path")
    if "pattern" in limits:
        bad = next((c for c in PATTERN_CANDIDATES if not re.search(limits["pattern"], c)), None)
        assert bad is not None, f"no candidate breaks pattern {limits['pattern']!r}"
        out.append(bad)
    return out


def bad_values(name: str, spec: dict) -> list[tuple[str, object]]:
    """(kind, value) for one option: wrong types from its type, out-of-range from choices/limits."""
    wanted = spec.get("type", "str")
    if wanted not in WRONG_TYPE:
        raise AssertionError(f"{name}: no wrong-type values for argument spec type {wanted!r}")
    out = [("type", v) for v in WRONG_TYPE[wanted]]
    own = spec_limits(spec)
    if wanted == "list":
        elements = spec.get("elements")
        if elements:
            out.append(("type", [WRONG_ELEMENT[elements]]))
        if spec.get("choices"):
            out.append(("range", ["NOSUCH"]))
        out += [("range", [v]) for v in _bad_scalar_for_limits(elements or "str", own)]
        if "min_items" in own:
            out.append(("range", []))
    elif wanted == "dict":
        base = declared_value(name)
        base = base if isinstance(base, dict) else {}
        if "allowed_keys" in own:
            sample = next(iter(base.values()), 1) if base else 1
            out.append(("range", {**base, "nosuchkey": sample}))
        if "value_choices" in own:
            key = next(iter(base), own.get("allowed_keys", ["k"])[0])
            out.append(("range", {**base, key: "nosuch"}))
        if "key_pattern" in own:
            key = next(k for k in ("SGLANG_API_KEY", "bad key", "1X") if not re.search(own["key_pattern"], k))
            out.append(("range", {**base, key: "x"}))
        if "value_keys" in own:
            key = next(iter(base), own.get("allowed_keys", ["K"])[0])
            out.append(("range", {**base, key: {"no_such_param": 1}}))
        if "value_type" in own:
            key = next(iter(base), "K")
            out.append(("range", {**base, key: WRONG_ELEMENT[own["value_type"]]}))
        if "value_pattern" in own:
            key = next(iter(base), "K")
            out.append(("range", {**base, key: "one line\nSECOND=line"}))
    else:
        if spec.get("choices"):
            out.append(("range", "NOSUCH"))
        out += [("range", v) for v in _bad_scalar_for_limits(wanted, own)]
    out += OVERRIDES.get(name, [])
    return out


def generate_cases() -> list[Case]:
    cases: list[Case] = []
    for name, (spec, playbook) in sorted(option_table().items()):
        assert playbook, f"{name}: no playbook validates an entry point that has this option"
        for kind, value in bad_values(name, spec):
            cases.append(Case(name, kind, value, playbook, {name: value},
                              expect=(re.escape(name) + r"\b", r"expected"), extra_vars=name in EXTRA_VARS_ONLY))
        for key, sub in (spec.get("options") or {}).items():
            base = declared_value(name)
            assert isinstance(base, dict), f"{name}: no declared value to derive sub-option cases from"
            dotted = f"{name}.{key}"
            for kind, value in bad_values(dotted, sub):
                cases.append(Case(dotted, kind, value, playbook, {name: {**base, key: value}},
                                  expect=(re.escape(dotted) + r"\b", r"expected")))
            if sub.get("required"):
                cases.append(Case(dotted, "range", "<missing>", playbook,
                                  {name: {k: v for k, v in base.items() if k != key}},
                                  expect=(re.escape(name) + r"\b", r"missing key\(s\) " + re.escape(key))))
    # Bad input outside the argument specs: what preflight reads from the inventory and the mirror.
    zeros, ones = "0" * 40, "1" * 64
    model, draft = declared_value("sglang_model"), declared_value("sglang_draft_model")
    cases += [
        Case("inventory: host in two architecture groups", "input", "sm86 + sm120", "converge",
             groups=("sm86", "sm120"), expect=(r"2\s+architecture groups", r"expected exactly one"), stage="preflight"),
        Case("inventory: wrong architecture group", "input", "sm120 (GPUs are sm86)", "converge",
             groups=("sm120",), expect=(r"group sm120", r"move it to group sm86"), stage="preflight"),
        Case("sglang_model.revision (not on the mirror)", "input", zeros, "converge",
             {"sglang_model": {**model, "revision": zeros}},
             expect=(r"sglang_model\b", r"does not serve", r"expected"), stage="preflight"),
        Case("sglang_draft_model.revision (not on the mirror)", "input", zeros, "converge",
             {"sglang_draft_model": {**draft, "revision": zeros}},
             expect=(r"sglang_draft_model\b", r"does not serve", r"expected"), stage="preflight"),
        Case("sglang_model_manifest_sha256 (not the mirror's)", "input", ones, "converge",
             {"sglang_model_manifest_sha256": ones},
             expect=(r"sglang_model_manifest_sha256=1{64}", r"expected"), stage="preflight"),
        Case("sglang_draft_manifest_sha256 (not the mirror's)", "input", ones, "converge",
             {"sglang_draft_manifest_sha256": ones},
             expect=(r"sglang_draft_manifest_sha256=1{64}", r"expected"), stage="preflight"),
        Case("sglang_venv_gib (more disk than the host has)", "input", 1000000, "converge",
             {"sglang_venv_gib": 1000000},
             expect=(r"not enough disk for the change", r"venv 1000000\.0 GiB \(sglang_venv_gib\)",
                     r"sglang_disk_headroom_gib"), stage="preflight"),
        Case("sglang_ddtree_style=flag (stock 0.5.23 lacks the fork's flag)", "input", "flag", "converge",
             {"sglang_ddtree_style": "flag", "sglang_speculative_algorithm": "DDTREE"},
             expect=(r"sglang_ddtree_style=flag", r"--speculative-dflash-enable-ddtree", r"expected"),
             stage="preflight"),
        Case("sglang_ddtree_budget (patch set without 0004: no such flag)", "input", 24, "converge",
             {"sglang_ddtree_budget": 24, "sglang_speculative_algorithm": "DDTREE",
              "sglang_patches": ["0001-ddtree-register-algorithm.patch", "0002-ddtree-dflash-family.patch",
                                 "0003-ddtree-tree.patch"]},
             expect=(r"sglang_ddtree_budget=24", r"--speculative-ddtree-budget", r"expected sglang_ddtree_budget=0",
                     r"0004-ddtree-worker\.patch"), stage="preflight"),
        Case("sglang_attention_backend=fa3 with DDTREE (the worker's tree verify)", "input", "fa3", "converge",
             {"sglang_attention_backend": "fa3", "sglang_speculative_algorithm": "DDTREE"},
             expect=(r"sglang_attention_backend=fa3", r"0004-ddtree-worker\.patch", r"flashinfer or triton",
                     r"expected sglang_attention_backend"), stage="preflight"),
        Case("sglang_draft_model (dims do not fit, spec_compat)", "input", "z-lab/Qwen3-8B-DFlash", "converge",
             {"sglang_draft_model": {"repo_id": "z-lab/Qwen3-8B-DFlash",
                                     "revision": "4f8bdd0dfaff83716f995f7e63e712a68282ac91", "weights_gib": 2},
              "sglang_draft_manifest_sha256": "f8d3048136a16697a5008ae41a6da31637c7cf9f735b6727f7be337cd8029236"},
             expect=(r"sglang_draft_model\b", r"do not fit", r"20480", r"25600", r"expected"), stage="preflight"),
    ]
    for i, case in enumerate(cases):
        case.alias = f"bad{i:03d}"
    return cases


# ------------------------------------------------------------------ inventory and runs

def write_inventory(directory: Path, hosts: list[dict], cases: list[Case], extra_groups: dict | None = None) -> Path:
    """hosts.yml (every case one alias of the lab host) + group_vars -> inventory/lab/group_vars."""
    directory.mkdir(parents=True, exist_ok=True)
    addr = f"10.213.{hosts[0]['index']}.2"
    groups: dict[str, dict] = {}
    for case in cases:
        for g in case.groups:
            entry = {"ansible_host": addr} if g == case.groups[0] else {}
            if g == case.groups[0]:
                entry.update(case.hostvars)
            groups.setdefault(g, {})[case.alias] = entry
    inv = {"sglang_servers": {"children": {g: {"hosts": h} for g, h in groups.items()}}}
    for name, members in (extra_groups or {}).items():
        inv[name] = {"hosts": {m: {} for m in members}}
    (directory / "hosts.yml").write_text(yaml.safe_dump(inv, sort_keys=False))
    link = directory / "group_vars"
    if not link.exists():
        link.symlink_to(REPO / "inventory" / "lab" / "group_vars")
    return directory


def ansible_env(tmp: Path, results: Path | None = None) -> dict[str, str]:
    """labkit's environment for ansible-playbook, plus a private fact cache and the results callback."""
    extra = {
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts"),  # hundreds of aliases stay out of .ansible/facts
        "ANSIBLE_RETRY_FILES_ENABLED": "false",
    }
    if results is not None:
        extra.update({"ANSIBLE_CALLBACK_PLUGINS": str(PLUGINS), "ANSIBLE_CALLBACKS_ENABLED": "badinput_results",
                      "BADINPUT_RESULTS": str(results)})
    return labkit.ansible_env(extra)


@dataclass
class PlaybookRun:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    results: Path | None = None

    def json(self) -> dict:
        assert self.results and self.results.is_file(), \
            f"no results file (rc {self.rc}):\n{self.stdout[-2000:]}\n{self.stderr[-2000:]}"
        return json.loads(self.results.read_text())


def start_playbook(playbook: str, inventory: Path, tmp: Path, *args: str, results: Path | None = None):
    argv = [str(VENV_BIN / "ansible-playbook"), playbook, "-i", str(inventory), *args]
    proc = subprocess.Popen(argv, cwd=REPO, env=ansible_env(tmp, results), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return argv, proc, time.monotonic(), results


def finish_playbook(started, timeout: float = 1800) -> PlaybookRun:
    argv, proc, t0, results = started
    out, err = proc.communicate(timeout=timeout)
    return PlaybookRun(argv, proc.returncode, out, err, time.monotonic() - t0, results)


def run_playbook(playbook: str, inventory: Path, tmp: Path, *args: str, results: Path | None = None) -> PlaybookRun:
    return finish_playbook(start_playbook(playbook, inventory, tmp, *args, results=results))


@dataclass
class Outcome:
    play_index: int | None = None  # play of the failure (0 = the first play)
    task: str | None = None
    msg: str = ""
    later_plays: list[str] = field(default_factory=list)  # tasks the host ran after the first play
    changed: int = 0


def outcomes(result: dict) -> dict[str, Outcome]:
    """host -> where it failed and with which message (results of badinput_results)."""
    out: dict[str, Outcome] = {}
    for index, play in enumerate(result.get("plays", [])):
        for res in play["results"]:
            o = out.setdefault(res["host"], Outcome())
            if index > 0:
                o.later_plays.append(res["task"])
            if res["changed"]:
                o.changed += 1
            if res["status"] in ("failed", "unreachable"):
                o.play_index, o.task = index, res["task"]
                msgs = [res["msg"]] + [i["msg"] for i in res["items"] if i["failed"]]
                o.msg = " ".join(" ".join(msgs).split())
    return out


# ------------------------------------------------------------------ host snapshot

SNAPSHOT_SCRIPT = r"""
set -u
for d in /etc/systemd/system /etc/sglang /var/lib/ddtree-fleet /opt/sglang /run/ddtree-fleet; do
  [ -e "$d" ] || { echo "MISSING $d"; continue; }
  find "$d" -xdev -printf 'META %p %y %m %u %g %s %l\n'
  find "$d" -xdev -type f -print0 | xargs -0 -r sha256sum | sed 's/^/SHA /'
done
systemctl show sglang.service -p LoadState -p ActiveState -p SubState -p ActiveEnterTimestamp -p MainPID \
  -p NRestarts -p UnitFileState | sed 's/^/SVC /'
systemctl list-timers --all --no-legend --no-pager | awk '{print "TIMER", $NF}' | sort
"""


def ssh_argv(addr: str, command: str) -> list[str]:
    return ["ssh", "-i", str(SSH_KEY), "-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", f"root@{addr}", command]


def snapshot(addr: str) -> list[str]:
    res = subprocess.run(ssh_argv(addr, SNAPSHOT_SCRIPT), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"snapshot of {addr} failed: {res.stderr}"
    return sorted(res.stdout.splitlines())


def snapshot_diff(before: list[str], after: list[str]) -> str:
    b, a = set(before), set(after)
    return "\n".join([f"- {x}" for x in sorted(b - a)][:40] + [f"+ {x}" for x in sorted(a - b)][:40])


def show(value: object, width: int = 40) -> str:
    text = value if isinstance(value, str) and value == "<missing>" else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."
