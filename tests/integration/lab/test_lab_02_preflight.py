"""Preflight failures and --check never change a host: a snapshot of every file the project owns
on the host (sha256, mode, owner, symlink target), every path and size under /opt/sglang, and
the service's start time and PID is taken before and after, and must be equal."""

from __future__ import annotations

import re
import shutil

import labkit
import pytest
import yaml

DRAFT_8B = ('{"sglang_draft_model": {"repo_id": "z-lab/Qwen3-8B-DFlash", '
            '"revision": "4f8bdd0dfaff83716f995f7e63e712a68282ac91", "weights_gib": 2}}')
DRAFT_8B_MANIFEST = "f8d3048136a16697a5008ae41a6da31637c7cf9f735b6727f7be337cd8029236"

CASES = {
    "mem_fraction_1.5": (["-e", "sglang_mem_fraction_static=1.5"],
                         [r'sglang_mem_fraction_static="?1\.5', r"expected a number \(> 0; < 1\)"]),
    "algorithm_typo": (["-e", "sglang_speculative_algorithm=DDTREEE"],
                       [r'sglang_speculative_algorithm="?DDTREEE', r"expected .*one of .*DDTREE"]),
    "draft_dims": (["-e", DRAFT_8B, "-e", f"sglang_draft_manifest_sha256={DRAFT_8B_MANIFEST}"],
                   [r"20480", r"25600"]),
    "hash_lock_missing": (["-e", "sglang_requirements_lock=/nonexistent/sglang.lock"],
                          [r"sglang_requirements_lock=/nonexistent/sglang.lock is missing or empty on the controller",
                           r"make host-lock"]),
}


def _assert_preflight_failure(run: labkit.Run, patterns: list[str]) -> None:
    assert run.rc != 0, f"expected a failure:\n{run}"
    recap = run.recap("ct129")
    assert recap["failed"] == 1 and recap["changed"] == 0, recap
    assert "fatal: [ct129" in run.out, run.tail()
    fatal = " ".join(run.out[run.out.find("fatal: [ct129"):].split())  # the yaml callback wraps lines
    for pattern in patterns:
        assert re.search(pattern, fatal), f"{pattern!r} not in the failure:\n{fatal[:3000]}"
    # It stopped in the preflight play: nothing of the install play ran for ct129.
    assert "PLAY [Preflight every targeted host" in run.out, run.tail()
    second_play = run.out.partition("PLAY [Change each host under the quality gate")[2]
    assert "TASK [" not in second_play, f"the change play ran after a failed preflight:\n{run.tail()}"


@pytest.mark.parametrize("case", list(CASES))
def test_preflight_failure_leaves_ct129_unchanged(lab, case):
    extra, patterns = CASES[case]
    before = labkit.snapshot("ct129")
    run = labkit.run_playbook("deploy_ddtree.yml", "-l", "ct129", *extra)
    after = labkit.snapshot("ct129")
    print(f"\n[preflight] {case}: rc {run.rc} in {run.seconds:.1f}s")
    _assert_preflight_failure(run, patterns)
    assert before == after, f"{case} changed ct129:\n{labkit.snapshot_diff(before, after)}"


def test_wrong_architecture_group_leaves_ct129_unchanged(lab, tmp_path):
    """ct129 (2x A6000, sm86) filed under sm120 in a copy of the lab inventory."""
    src = labkit.INVENTORY   # inventory/lab, or this worker's lab slot's copy of it
    inv = tmp_path / "inventory"
    inv.mkdir()
    shutil.copytree(src / "group_vars", inv / "group_vars")
    hosts = yaml.safe_load((src / "hosts.yml").read_text())
    groups = hosts["sglang_servers"]["children"]
    entry = groups["sm86"]["hosts"].pop("ct129")
    groups["sm120"]["hosts"]["ct129"] = entry
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))

    before = labkit.snapshot("ct129")
    run = labkit.run_playbook("deploy_ddtree.yml", "-i", str(inv / "hosts.yml"), "-l", "ct129")
    after = labkit.snapshot("ct129")
    print(f"\n[preflight] wrong arch group: rc {run.rc} in {run.seconds:.1f}s")
    _assert_preflight_failure(run, [r"group sm120", r"sm86", r"move it to group sm86"])
    assert before == after, f"wrong group changed ct129:\n{labkit.snapshot_diff(before, after)}"


def test_check_diff_on_ct200_shows_ddtree_and_changes_nothing(lab):
    before = labkit.snapshot("ct200")
    assert "--speculative-algorithm NEXTN " in labkit.read_text("ct200", labkit.UNIT)
    run = labkit.run_playbook("deploy_ddtree.yml", "--check", "--diff", "-l", "ct200")
    after = labkit.snapshot("ct200")
    print(f"\n[check] ct200 --check --diff: rc {run.rc} in {run.seconds:.1f}s")
    assert run.rc == 0, str(run)
    m = re.search(r"^--- before: /etc/systemd/system/sglang\.service\n\+\+\+ after: /etc/systemd/system/"
                  r"sglang\.service\n(.*?)\n\n", run.out, re.M | re.S)
    assert m, f"no diff of the unit in the output:\n{run.tail(120)}"
    diff = m.group(1)
    added = [line for line in diff.splitlines() if line.startswith("+")]
    removed = [line for line in diff.splitlines() if line.startswith("-")]
    assert any("--speculative-algorithm DDTREE " in line for line in added), diff
    assert any("--speculative-algorithm NEXTN " in line for line in removed), diff
    # A dry run cannot gate a service it did not start: it must not claim a promotion.
    assert "ct200: promoted" not in " ".join(run.out.split()), run.tail(40)
    probed = re.findall(r"^TASK \[ddtree\.fleet\.quality_gate : Probe the service[^\]]*\] \**\n(?:ok|changed|fatal): \[ct200\]",
                        run.out, re.M)
    assert not probed, "--check probed the old service as if it were the new one"
    assert before == after, f"--check changed ct200:\n{labkit.snapshot_diff(before, after)}"


def test_site_settings_in_the_inventory_win_over_the_project_defaults(lab, tmp_path):
    """A pin where README says site settings go (the inventory's group_vars, `all` included)
    reaches the rendered unit, over the project's group_vars/all.yml and <arch>.yml."""
    src = labkit.INVENTORY
    inv = tmp_path / "inventory"
    shutil.copytree(src, inv, ignore=shutil.ignore_patterns("*.py"))
    site_all = "sglang_mem_fraction_static: 0.77   # site-wide pin (the project's sm120.yml has its own)\n"
    if (inv / "group_vars" / "all").is_dir():
        (inv / "group_vars" / "all" / "90-site.yml").write_text("---\n" + site_all)
    else:
        with open(inv / "group_vars" / "all.yml", "a") as fh:
            fh.write(site_all)
    (inv / "group_vars" / "sm120.yml").write_text("---\nsglang_cuda_graph_max_bs: 12\n")
    before = labkit.snapshot("ct200")
    run = labkit.run_playbook("deploy_ddtree.yml", "-i", str(inv / "hosts.yml"), "--check", "--diff",
                              "-l", "ct200")
    after = labkit.snapshot("ct200")
    assert run.rc == 0, str(run)
    m = re.search(r"^\+\+\+ after: /etc/systemd/system/sglang\.service\n(.*?)\n\n", run.out, re.M | re.S)
    assert m, f"no diff of the unit in the output:\n{run.tail(120)}"
    added = " ".join(line for line in m.group(1).splitlines() if line.startswith("+"))
    assert "--mem-fraction-static 0.77 " in added, m.group(1)
    assert "--cuda-graph-max-bs-decode 12 " in added, m.group(1)
    assert before == after, f"--check changed ct200:\n{labkit.snapshot_diff(before, after)}"
