"""lab/labctl.py without root: argument handling of `restart`, host lookup, what `down` finds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "lab"))

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
