"""lab/labctl.py without root: argument handling of `restart`, host lookup, what `down` finds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

import labctl  # noqa: E402


@pytest.fixture
def state(tmp_path, monkeypatch):
    """labctl with its state directory in tmp_path and no real network namespaces."""
    monkeypatch.setattr(labctl, "STATE", tmp_path)
    monkeypatch.setattr(labctl, "netns_list", lambda: [])
    return tmp_path


def test_restart_takes_exactly_one_name():
    args = labctl.build_parser().parse_args(["restart", "ct129"])
    assert (args.cmd, args.name, args.fleet, args.timeout) == ("restart", "ct129", None, 90)
    for bad in (["restart"], ["restart", "ct129", "ct200"], ["restart", "--timeout", "x", "ct129"]):
        with pytest.raises(SystemExit) as exc:
            labctl.build_parser().parse_args(bad)
        assert exc.value.code == 2


def test_restart_options():
    args = labctl.build_parser().parse_args(["restart", "sc03", "--fleet", "f.json", "--timeout", "30"])
    assert (args.name, args.fleet, args.timeout) == ("sc03", Path("f.json"), 30.0)


def test_main_dispatches_restart(state, monkeypatch):
    calls = []
    monkeypatch.setattr(labctl, "CACHE", state / "cache")
    monkeypatch.setattr(labctl, "restart", lambda *a: calls.append(a))
    labctl.main(["restart", "ct200"])
    assert calls == [("ct200", None, 90)]


def test_restart_needs_root(state, monkeypatch):
    monkeypatch.setattr(labctl.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="must run as root"):
        labctl.restart("ct129")


def test_restart_refuses_a_host_that_was_never_booted(state, monkeypatch):
    monkeypatch.setattr(labctl.os, "geteuid", lambda: 0)
    with pytest.raises(SystemExit, match="no disk"):
        labctl.restart("ct129")
    with pytest.raises(SystemExit, match="unknown host 'nope'"):
        labctl.restart("nope")


def test_restart_refuses_a_host_without_its_netns(state, monkeypatch):
    monkeypatch.setattr(labctl.os, "geteuid", lambda: 0)
    (state / "hosts" / "ct200" / "upper").mkdir(parents=True)
    with pytest.raises(SystemExit, match="network namespace ddl-ct200 is gone"):
        labctl.restart("ct200")


def test_find_host_lab_fleet_and_scale_hosts(state):
    assert labctl.find_host("ct129")["addr"] == "10.213.1.2"
    lab05 = labctl.find_host("lab05")
    assert (lab05["addr"], lab05["arch_group"], lab05["veth_host"]) == ("10.213.5.2", "sm86", "ddl5h")
    assert labctl.find_host("lab08")["arch_group"] == "sm120"


def test_find_host_from_its_record_and_from_a_fleet_file(state):
    h = labctl.describe([{"name": "sc03", "index": 43, "profile": "a6000x2"}])[0]
    h["dir"].mkdir(parents=True)
    labctl.write_host_record(h, Path("/base/rootfs"))
    found = labctl.find_host("sc03")
    assert (found["addr"], found["netns"], found["arch_group"], found["lowerdir"]) == (
        "10.213.43.2", "ddl-sc03", "sm86", "/base/rootfs")
    fleet = state / "fleet.json"
    fleet.write_text(json.dumps({"hosts": [{"name": "sc04", "index": 44, "profile": "rtxpro6000x8"}]}))
    assert labctl.find_host("sc04", fleet)["veth_host"] == "ddl44h"
    with pytest.raises(SystemExit, match="no host 'sc05'"):
        labctl.find_host("sc05", fleet)


def test_up_hosts_8_alternates_architectures(state):
    hosts = labctl.fleet(8)
    assert [h["name"] for h in hosts] == ["ct129", "ct200"] + [f"lab{i:02d}" for i in range(3, 9)]
    assert [h["arch_group"] for h in hosts] == ["sm86", "sm120"] * 4
    assert len({h["addr"] for h in hosts}) == 8


def test_down_finds_every_host_on_disk(state):
    """`labctl down` (no --fleet) tears down what known_hosts_on_disk returns: lab03..lab08 too."""
    for name in ["ct129", "ct200"] + [f"lab{i:02d}" for i in range(3, 9)] + ["stray"]:
        (state / "hosts" / name).mkdir(parents=True)
    h = labctl.describe([{"name": "sc05", "index": 45, "profile": "rtxpro6000x8"}])[0]
    h["dir"].mkdir(parents=True)
    labctl.write_host_record(h, Path("/base"))
    found = {h["name"]: h for h in labctl.known_hosts_on_disk()}
    assert set(found) == {"ct129", "ct200", "stray", "sc05"} | {f"lab{i:02d}" for i in range(3, 9)}
    assert found["lab07"]["veth_host"] == "ddl7h" and found["lab07"]["netns"] == "ddl-lab07"
    assert found["sc05"]["veth_host"] == "ddl45h"
    assert found["stray"]["veth_host"] is None and found["stray"]["netns"] == "ddl-stray"


# ------------------------------------------------------------------ lab slots (labctl up --slots)

def test_slot_hosts_are_copies_of_the_lab_on_their_own_addresses(state):
    main = labctl.fleet()
    taken = {h["index"] for h in main + labctl.fleet(8)} | {21, 22, 31, 32, 51} | set(range(41, 49))
    seen = set()
    for k in (1, 2, 15):
        hosts = labctl.slot_fleet(k)
        assert [h["alias"] for h in hosts] == [h["name"] for h in main]   # ct129, ct200 again
        assert [h["name"] for h in hosts] == [f"s{k}-ct129", f"s{k}-ct200"]
        assert [h["arch_group"] for h in hosts] == [h["arch_group"] for h in main]
        for h in hosts:
            assert h["index"] not in taken and h["index"] not in seen and h["index"] <= 255, h
            seen.add(h["index"])
            assert h["netns"] == f"ddl-{h['name']}" and h["veth_host"] == f"ddl{h['index']}h"
    for bad in (0, labctl.MAX_SLOTS):
        with pytest.raises(SystemExit, match="out of range"):
            labctl.slot_fleet(bad)


def test_a_slot_inventory_names_its_machines_like_the_lab(state):
    """What Ansible itself reads from a slot's inventory: the lab's names and groups, the slot's
    addresses, the lab's group_vars (through the symlink) and the slot's own output dirs."""
    d = labctl.write_slot(2)
    env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_HOME": str(state / "ansible-home"),
           "PATH": f"{REPO / '.venv' / 'bin'}:/usr/bin:/bin"}
    out = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-inventory"), "-i", str(d / "inventory"), "--list"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    inv = json.loads(out)
    hv = inv["_meta"]["hostvars"]
    assert set(hv) == {"ct129", "ct200"}
    assert (hv["ct129"]["ansible_host"], hv["ct200"]["ansible_host"]) == ("10.213.64.2", "10.213.65.2")
    assert inv["sm86"]["hosts"] == ["ct129"] and inv["sm120"]["hosts"] == ["ct200"]
    assert hv["ct129"]["ddtree_artifacts_dir"] == str(REPO / "artifacts" / "lab-slot2")
    assert hv["ct129"]["lab_mirror"] == "http://10.213.0.1:8873"   # inventory/lab/group_vars/all.yml
    entries = json.loads((d / "hosts.json").read_text())
    assert [(e["name"], e["machine"], e["netns"]) for e in entries] == [
        ("ct129", "s2-ct129", "ddl-s2-ct129"), ("ct200", "s2-ct200", "ddl-s2-ct200")]
    # labctl restart/reset/down --fleet find the slot's machines from its fleet file.
    assert labctl.find_host("s2-ct200", d / "fleet.json")["alias"] == "ct200"


def test_up_refuses_bad_slot_counts(state, monkeypatch):
    monkeypatch.setattr(labctl.os, "geteuid", lambda: 0)
    with pytest.raises(SystemExit, match="--slots must be 1"):
        labctl.up(None, None, slots=0)
    with pytest.raises(SystemExit, match="does not go with --fleet"):
        labctl.up(None, state / "f.json", slots=2)
    for first in (0, 16):
        with pytest.raises(SystemExit, match="--first-slot must be 1..15"):
            labctl.up(None, None, slots=16, first_slot=first)


def test_down_of_a_slots_fleet_removes_its_inventory_too(state, monkeypatch):
    """A test's own slots (up --first-slot) go with `down --fleet <slot>/fleet.json`."""
    monkeypatch.setattr(labctl.os, "geteuid", lambda: 0)
    torn = []
    monkeypatch.setattr(labctl, "teardown_host", lambda h, quiet=False: torn.append(h["name"]))
    slot = labctl.write_slot(12)
    other = labctl.write_slot(13)
    labctl.down(slot / "fleet.json")
    assert torn == ["s12-ct129", "s12-ct200"]
    assert not slot.exists() and other.exists()


def test_reset_needs_a_snapshot_and_names_the_command(state, monkeypatch):
    monkeypatch.setattr(labctl.os, "geteuid", lambda: 0)
    monkeypatch.setattr(labctl, "netns_list", lambda: ["ddl-ct129"])
    (state / "hosts" / "ct129" / "upper").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"ct129 has no snapshot; take one with `labctl snapshot ct129`"):
        labctl.reset("ct129")
    args = labctl.build_parser().parse_args(["reset", "s1-ct129", "s1-ct200", "--fleet", "f.json"])
    assert (args.names, args.fleet) == (["s1-ct129", "s1-ct200"], Path("f.json"))


def test_a_cloned_disk_keeps_the_seeded_state_but_not_the_hosts_identity(tmp_path):
    snap = tmp_path / "snapshot"
    for rel, text in {"etc/machine-id": "abc\n", "etc/hostname": "ct129\n", "etc/hosts": "127.0.1.1 ct129\n",
                      "etc/ssh/ssh_host_ed25519_key": "k", "etc/ssh/ssh_host_ed25519_key.pub": "p",
                      "etc/ssh/sshd_config.d/10-lab.conf": "UseDNS no\n",
                      "var/log/journal/abc/system.journal": "j",
                      "etc/systemd/system/sglang.service": "[Service]\n",
                      "var/lib/ddtree-fleet/records/r1/meta.json": "{}"}.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_text(text)
    (snap / "var/lib/ddtree-fleet/known-good").symlink_to("records/r1")
    labctl.clone_disk(snap, tmp_path / "new-host" / "upper")   # a host whose directory is not there yet
    assert (tmp_path / "new-host" / "upper" / "etc/systemd/system/sglang.service").is_file()
    upper = tmp_path / "upper"
    upper.mkdir()
    (upper / "stale").write_text("from an earlier boot")
    labctl.clone_disk(snap, upper)
    files = sorted(str(p.relative_to(upper)) for p in upper.rglob("*") if p.is_file() or p.is_symlink())
    assert files == ["etc/ssh/sshd_config.d/10-lab.conf", "etc/systemd/system/sglang.service",
                     "var/lib/ddtree-fleet/known-good", "var/lib/ddtree-fleet/records/r1/meta.json"]
    assert (upper / "var/lib/ddtree-fleet/known-good").readlink() == Path("records/r1")
    assert (snap / "etc/machine-id").read_text() == "abc\n"   # the snapshot itself is untouched


def test_stale_slot_directories_are_dropped(state):
    for k in (1, 2, 5):
        labctl.write_slot(k)
    (state / "slots" / "junk").mkdir()
    labctl.drop_stale_slots(3)   # slots 1 and 2 are kept (up is booting them); 5 runs nowhere
    assert sorted(p.name for p in (state / "slots").iterdir()) == ["1", "2"]


def test_inotify_instances_are_raised_for_many_hosts_never_lowered(state, monkeypatch, tmp_path):
    sysctl = tmp_path / "max_user_instances"
    monkeypatch.setattr(labctl, "INOTIFY_INSTANCES_SYSCTL", sysctl)
    for name in ("ct129", "ct200"):
        (state / "hosts" / name).mkdir(parents=True)
    sysctl.write_text("128\n")
    labctl.ensure_inotify_instances(16)          # 2 running + 16 booting
    assert int(sysctl.read_text()) == 128 + labctl.INOTIFY_INSTANCES_PER_HOST * 18
    sysctl.write_text("100000\n")
    labctl.ensure_inotify_instances(16)
    assert sysctl.read_text() == "100000\n"
