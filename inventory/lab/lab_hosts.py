#!/usr/bin/env python3
"""Ansible inventory script: the lab hosts that `labctl up --hosts N` booted beyond hosts.yml.

`make lab-up N=8` boots ct129 and ct200 (hosts.yml) plus lab03..lab08. This script reads the lab's
state file ($DDTREE_LAB_STATE/hosts.json, default /var/lib/ddtree-lab/hosts.json, written by
`labctl up`) and emits every running lab host that hosts.yml does not already list, in its
architecture group (sm86, sm120, ...) under sglang_servers, with its ansible_host. The lab-wide
settings (ssh key, known_hosts, mirror) come from group_vars/all.yml next to it, as for ct129.

It emits an empty inventory when the lab is down, the state file is absent or unreadable, or a
host's container is not running (a host whose nspawn process is gone is not listed). Standard
library only: Ansible runs it with the system python3.

  inventory/lab/lab_hosts.py --list
  inventory/lab/lab_hosts.py --host lab03      # {} (host vars come with --list in _meta)
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATIC = HERE / "hosts.yml"
GROUP = "sglang_servers"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def state_dir() -> Path:
    return Path(os.environ.get("DDTREE_LAB_STATE", "/var/lib/ddtree-lab"))


def static_hosts(path: Path = STATIC) -> set[str]:
    """Host names listed under any `hosts:` key of a YAML inventory (no PyYAML needed).

    Block-style YAML as hosts.yml uses it: a key at the first indentation level below a
    `hosts:` line is a host name.
    """
    names: set[str] = set()
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return names
    hosts_indent = None  # indentation of the `hosts:` key we are inside
    child_indent = None  # indentation of its keys (the host names)
    for raw in lines:
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() or line.strip() == "---":
            continue
        indent = len(line) - len(line.lstrip(" "))
        key = line.strip()
        if hosts_indent is not None and indent <= hosts_indent:
            hosts_indent = child_indent = None
        if hosts_indent is not None:
            if child_indent is None:
                child_indent = indent
            if indent == child_indent and ":" in key:
                name = key.split(":", 1)[0].strip().strip("'\"")
                if NAME.match(name):
                    names.add(name)
            continue
        if key.startswith("hosts:"):
            rest = key[len("hosts:"):].strip()
            if rest.startswith("{"):  # flow style: hosts: {a: ..., b: {...}}
                names |= flow_keys(rest)
            elif not rest:
                hosts_indent = indent
    return names


def flow_keys(text: str) -> set[str]:
    """Top-level keys of a one-line YAML flow mapping such as `{a: {}, b: {x: 1}}`."""
    keys, depth, token = set(), 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
            token = ""
        elif ch in "}]":
            depth -= 1
            token = ""
        elif depth == 1 and ch == ":":
            name = token.strip().strip("'\"")
            if NAME.match(name):
                keys.add(name)
            token = ""
        elif depth == 1 and ch == ",":
            token = ""
        elif depth == 1:
            token += ch
    return keys


def running(name: str, state: Path) -> bool:
    """The host's nspawn process (labctl writes its PID) is alive."""
    try:
        pid = int((state / "hosts" / name / "nspawn.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError):
        return False
    return f"-M {name} " in cmdline


def lab_hosts(state: Path | None = None, static: Path = STATIC) -> list[dict]:
    state = state or state_dir()
    try:
        entries = json.loads((state / "hosts.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(entries, list):
        return []
    listed = static_hosts(static)
    out = []
    for e in entries:
        if not isinstance(e, dict):
            continue
        name, addr, group = e.get("name"), e.get("address"), e.get("arch_group")
        if not (isinstance(name, str) and NAME.match(name) and addr and isinstance(group, str) and NAME.match(group)):
            continue
        if name in listed or not running(name, state):
            continue
        out.append({"name": name, "address": addr, "arch_group": group})
    return out


def inventory(hosts: list[dict]) -> dict:
    inv: dict = {"_meta": {"hostvars": {}}}
    if not hosts:
        return inv
    groups = sorted({h["arch_group"] for h in hosts})
    inv[GROUP] = {"children": groups}
    for g in groups:
        inv[g] = {"hosts": [h["name"] for h in hosts if h["arch_group"] == g]}
    inv["_meta"]["hostvars"] = {h["name"]: {"ansible_host": h["address"]} for h in hosts}
    return inv


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--host":
        print("{}")
        return 0
    if len(argv) != 1 and argv[1:] != ["--list"]:
        print("usage: lab_hosts.py --list | --host NAME", file=sys.stderr)
        return 2
    print(json.dumps(inventory(lab_hosts()), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
