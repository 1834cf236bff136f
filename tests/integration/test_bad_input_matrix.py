"""Bad input fails before any change (issue 7), as a matrix generated from the argument specs.

Every option of every entry point of every role (roles/*/meta/argument_specs.yml), every
sub-option, and the playbooks' own knobs (role validate_inputs' options) is tried with wrong types
(from its ``type``: including the values Ansible's argument-spec validation silently converts)
and out-of-range values (from ``choices`` and the documented limits). Plus: a host in two
architecture groups or the wrong one, model/draft revisions and manifest pins the mirror does not
have, a draft whose dims do not fit, unknown hosts and groups in ``-l``, ``ddtree_hosts``,
``ddtree_canary`` and ``ddtree_controllers``.

One ansible-playbook run per playbook evaluates all its cases at once: a throwaway inventory
holds one alias of the test's own lab host (bad-a, tests/integration/badinput_fleet.json) per
case, each carrying its one bad value as a host var; the json callback gives every alias's
failure. Each case must fail in the playbook's first play (for spec cases: in the input checks
of role validate_inputs), with a message naming the variable and what is
expected, and no alias may reach a later play. bad-a is snapshotted (every file under
/etc/systemd/system, /etc/sglang, /var/lib/ddtree-fleet, /opt/sglang, /run/ddtree-fleet, the
service's state, the timers) before and after: it must be byte-for-byte unchanged. bad-a is
not seeded with the service (the matrix must not change an empty host either; lab tests 02
cover a seeded host).

Skips without root or the lab (image, mirror, nspawn); under CI=true that is a failure.
The table of cases is printed and written to artifacts/bad-input-matrix.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import badinput_testlib as bl  # noqa: E402

ARTIFACT = bl.REPO / "artifacts" / "bad-input-matrix.md"
LABCTL = bl.REPO / "lab" / "labctl.py"


# ------------------------------------------------------------------ static checks (no lab)

def test_every_entry_point_is_validated_up_front():
    """Each role entry point is in the up-front list of a playbook that reaches it."""
    eps = bl.entry_points()
    listed = {ref for refs in eps.values() for ref in refs}
    specs = bl.role_specs()
    missing = [f"{r}:{e}" for r, entries in specs.items() for e in entries
               if f"{r}:{e}" not in listed and r != "validate_inputs"]   # its own options: always checked
    assert not missing, f"entry points no playbook validates up front (roles/validate_inputs/vars/main.yml): {missing}"
    unknown = [ref for ref in listed if ref.split(":")[0] not in specs or ref.split(":")[1] not in specs[ref.split(":")[0]]]
    assert not unknown, f"roles/validate_inputs/vars/main.yml lists entry points without an argument spec: {unknown}"


def test_every_option_gets_cases():
    """A new option gets cases without editing this test; numeric options need a documented range."""
    table = bl.option_table()
    cases = bl.generate_cases()
    by_option = {}
    for c in cases:
        by_option.setdefault(c.option.split(".")[0], set()).add(c.kind)
    for name, (spec, _playbook) in table.items():
        assert "type" in by_option.get(name, set()), f"{name}: no wrong-type case"
        subs = spec.get("options") or {}
        for key, sub in list(subs.items()) + [(None, spec)]:
            dotted = f"{name}.{key}" if key else name
            if (sub.get("type") in ("int", "float") or sub.get("elements") in ("int", "float")):
                assert bl.spec_limits(sub), f"{dotted}: a number without a Limits: line in its argument spec"
        if spec.get("choices") or bl.spec_limits(spec):
            assert "range" in by_option[name], f"{name}: has choices/limits but no out-of-range case"


def test_defaults_and_argument_specs_agree():
    """defaults/main.yml and meta/argument_specs.yml of every role declare the same defaults."""
    problems = []
    for role, entries in bl.role_specs().items():
        defaults = bl.load_yaml(bl.REPO / "roles" / role / "defaults" / "main.yml") or {}
        for ep, options in entries.items():
            for name, spec in options.items():
                if "default" in spec and name in defaults and not str(defaults[name]).startswith("{{"):
                    if defaults[name] != spec["default"] and str(defaults[name]) != str(spec["default"]):
                        problems.append(f"{role}:{ep} {name}: defaults {defaults[name]!r} != spec {spec['default']!r}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ the matrix on a lab host

def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "must run as root (labctl boots a systemd-nspawn host)"
    if not (bl.VENV_BIN / "ansible-playbook").exists():
        return f"{bl.VENV_BIN}/ansible-playbook is missing (run `make venv`)"
    for tool in ("ssh", "ip", "systemd-nspawn"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make lab-deps)"
    return None


@pytest.fixture(scope="module")
def bad_host():
    """bad-a booted with labctl up --fleet for this module, always taken down again."""
    def unavailable(why: str):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"bad-input matrix cannot run under CI: {why}", pytrace=False)
        pytest.skip(f"lab not available: {why}")

    why = _unavailable()
    if why:
        unavailable(why)
    up = subprocess.run([sys.executable, str(LABCTL), "up", "--fleet", str(bl.FLEET_FILE)],
                        capture_output=True, text=True, timeout=1800)
    try:
        if up.returncode != 0:
            unavailable(f"labctl up --fleet failed: {(up.stdout + up.stderr).strip()[-500:]}")
        hosts = [{**h} for h in bl.load_yaml(bl.FLEET_FILE)["hosts"]]
        addr = f"10.213.{hosts[0]['index']}.2"
        probe = subprocess.run(bl.ssh_argv(addr, "true"), capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            unavailable(f"{hosts[0]['name']} ({addr}) is unreachable over ssh: {probe.stderr.strip()[:200]}")
        yield {"hosts": hosts, "addr": addr}
    finally:
        subprocess.run([sys.executable, str(LABCTL), "down", "--fleet", str(bl.FLEET_FILE)],
                       capture_output=True, text=True, timeout=300)


def _check_case(case: bl.Case, o: bl.Outcome | None) -> str | None:
    """Why the case's outcome is wrong (None: it failed early with a good message)."""
    if o is None:
        return "no result for the alias"
    if o.later_plays:
        return f"reached a later play: {o.later_plays[:3]}"
    if o.play_index != 0:
        return "did not fail"
    if o.changed:
        return f"{o.changed} changed result(s)"
    if case.stage == "validate" and o.task not in bl.VALIDATION_TASKS:
        return f"failed at {o.task!r}, not in the input checks"
    missing = [p for p in case.expect if not re.search(p, o.msg)]
    if missing:
        return f"message lacks {missing}"
    return None


def test_bad_input_matrix_fails_before_any_change(bad_host, tmp_path):
    t0 = time.monotonic()
    cases = bl.generate_cases()
    addr = bad_host["addr"]
    before = bl.snapshot(addr)
    rows: list[tuple[str, str, str, str, str]] = []
    wrong: list[str] = []
    timings = {}

    # The extra-vars cases first (their own runs, concurrently). bad-a is filed under the wrong
    # architecture group there, so an input that slipped through still stops in preflight.
    inv_x = bl.write_inventory(tmp_path / "inv-x", bad_host["hosts"],
                               [bl.Case("-", "input", "-", "converge", groups=("sm120",), alias="bad-a")],
                               extra_groups={"badinput_ctl": ["bad-a"]})
    extra_runs = {
        "ddtree_hosts=nosuchgroup": ("deploy_ddtree.yml", ["-e", "ddtree_hosts=nosuchgroup"],
                                     [r"ddtree_hosts=nosuchgroup matches no host or group", r"expected"]),
        "ddtree_hosts=sglang_servers,nosuchgroup": ("deploy_ddtree.yml", ["-e", "ddtree_hosts=sglang_servers,nosuchgroup"],
                                                    [r"ddtree_hosts nosuchgroup: no such host or group", r"expected"]),
        "-l nosuchhost": ("deploy_ddtree.yml", ["-l", "nosuchhost"],
                          [r"Could not match supplied host pattern, ignoring: nosuchhost", r"--limit leaves us with no hosts"]),
        "-l bad-a,nosuchhost": ("deploy_ddtree.yml", ["-l", "bad-a,nosuchhost"],
                                [r"-l nosuchhost: no such host or group", r"expected"]),
        "ddtree_canary=nosuchhost": ("deploy_ddtree.yml", ["-e", "ddtree_canary=nosuchhost"],
                                     [r"ddtree_canary=nosuchhost is not one of the hosts", r"expected"]),
        "benchmark ddtree_hosts=nosuchgroup": ("benchmark.yml", ["-e", "ddtree_hosts=nosuchgroup"],
                                               [r"ddtree_hosts=nosuchgroup matches no host or group", r"expected"]),
        "ddtree_controllers=nosuchgroup": ("playbooks/drift_timer.yml", ["-e", "ddtree_controllers=nosuchgroup"],
                                           [r"ddtree_controllers=nosuchgroup matches no host or group", r"expected"]),
    }
    for case in cases:
        if case.extra_vars:
            extra_runs[f"{case.option}={bl.show(case.value)}"] = (
                bl.PLAYBOOKS[case.playbook], ["-e", json.dumps(case.hostvars)], list(case.expect))
    started = {k: bl.start_playbook(pb, inv_x / "hosts.yml", tmp_path, *args) for k, (pb, args, _) in extra_runs.items()}
    for key, (pb, args, patterns) in extra_runs.items():
        run = bl.finish_playbook(started[key])
        text = " ".join((run.stdout + "\n" + run.stderr).split())
        problem = None
        if run.rc == 0:
            problem = "exit code 0"
        elif re.search(r"^(PLAY \[(Change each host|Benchmark each)|TASK \[drift_timer :)", run.stdout, re.M):
            problem = "reached the change play"
        else:
            lacking = [p for p in patterns if not re.search(p, text)]
            problem = f"output lacks {lacking}" if lacking else None
        m = next((re.search(p, text) for p in patterns if re.search(p, text)), None)
        excerpt = text[max(0, m.start() - 20): m.start() + 140] if m else text[-160:]
        rows.append((key, "(extra vars)", "ok" if problem is None else f"WRONG: {problem}", excerpt, pb))
        if problem:
            wrong.append(f"{key}: {problem}\n{run.stdout[-1500:]}\n{run.stderr[-1500:]}")
    timings["extra-var runs"] = time.monotonic() - t0

    # The matrix: one run per playbook, every case one alias.
    for playbook, path in bl.PLAYBOOKS.items():
        mine = [c for c in cases if c.playbook == playbook and not c.extra_vars]
        if not mine:
            continue
        inv = bl.write_inventory(tmp_path / f"inv-{playbook}", bad_host["hosts"], mine,
                                 extra_groups={"badinput_ctl": [c.alias for c in mine]} if playbook == "drift_timer" else None)
        args = ["-f", "20"] + (["-e", "ddtree_controllers=badinput_ctl"] if playbook == "drift_timer" else [])
        t1 = time.monotonic()
        run = bl.run_playbook(path, inv / "hosts.yml", tmp_path, *args, results=tmp_path / f"results-{playbook}.json")
        timings[f"{playbook} matrix ({len(mine)} cases)"] = time.monotonic() - t1
        assert run.rc != 0, f"{path}: every case should fail, rc 0"
        results = bl.outcomes(run.json())
        for case in mine:
            o = results.get(case.alias)
            problem = _check_case(case, o)
            excerpt = (o.msg if o else "")
            m = re.search(case.expect[0], excerpt) if case.expect else None
            if m:
                excerpt = excerpt[max(0, m.start() - 10):]
            excerpt = excerpt[:140]
            rows.append((case.option, bl.show(case.value), "ok" if problem is None else f"WRONG: {problem}",
                         excerpt, playbook))
            if problem:
                wrong.append(f"{case.alias} {case.option}={bl.show(case.value, 80)} ({playbook}): {problem}; "
                             f"task {o.task if o else None!r}: {o.msg[:400] if o else ''}")

    after = bl.snapshot(addr)
    total = time.monotonic() - t0
    _write_table(rows, timings, total, before == after)
    assert before == after, f"the matrix changed {addr}:\n{bl.snapshot_diff(before, after)}"
    assert not wrong, f"{len(wrong)} of {len(rows)} cases did not fail early with a good message:\n" + "\n".join(wrong[:40])
    assert len(rows) == len(extra_runs) + sum(1 for c in cases if not c.extra_vars)


def _write_table(rows, timings, total, unchanged) -> None:
    ok = sum(1 for r in rows if r[2] == "ok")
    lines = ["# Bad input matrix", "",
             f"{len(rows)} cases ({ok} failed early with a good message), generated from roles/*/meta/argument_specs.yml "
             f"(their Limits lines); host byte-for-byte unchanged: {unchanged}; {total:.0f} s "
             f"({', '.join(f'{k}: {v:.0f} s' for k, v in timings.items())}).", "",
             "| option | bad value | playbook | outcome | message excerpt |", "|---|---|---|---|---|"]
    for option, value, outcome, excerpt, playbook in rows:
        cells = [option, value, playbook, outcome, excerpt]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    text = "\n".join(lines) + "\n"
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(text)
    print("\n" + "\n".join(f"{r[0][:44]:44} {r[1][:24]:24} {r[2][:10]:10} {r[3][:70]}" for r in rows))
    print(f"\n[bad-input] {len(rows)} cases, {ok} ok, {total:.0f} s; table: {ARTIFACT}")
