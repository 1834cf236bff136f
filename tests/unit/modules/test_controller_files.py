"""controller_files (plugins/module_utils/files.py, its action plugin and module): a directory
and its files written in one step, each file atomically; unchanged files left alone; check mode
writes nothing and says what would change; --diff shows each file; bad input is named."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.ddtree.fleet.plugins.module_utils import files

REPO = Path(__file__).resolve().parents[3]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_the_directory_and_files_then_has_nothing_to_do(tmp_path):
    target = tmp_path / "a" / "b"
    spec = [{"name": "x.json", "content": "{}\n"}, {"name": "y.txt", "content": "h\u00e9\n", "mode": "0600"}]
    plan = files.plan(str(target), spec, "0750", "0640")
    assert plan["dir_created"] and [e["state"] for e in plan["files"]] == ["absent", "absent"]
    assert files.apply(plan) == ["x.json", "y.txt"]
    assert (target / "x.json").read_text() == "{}\n" and (target / "y.txt").read_bytes() == "h\u00e9\n".encode()
    assert mode_of(target) == 0o750 and mode_of(target.parent) == 0o750
    assert mode_of(target / "x.json") == 0o640 and mode_of(target / "y.txt") == 0o600
    again = files.plan(str(target), spec, "0750", "0640")
    assert not again["dir_created"] and [e["state"] for e in again["files"]] == ["same", "same"]
    assert files.apply(again) == []
    assert sorted(os.listdir(target)) == ["x.json", "y.txt"]          # no temporary file left behind


def test_a_changed_content_or_mode_is_written_and_only_that(tmp_path):
    files.apply(files.plan(str(tmp_path), [{"name": "a", "content": "1"}, {"name": "b", "content": "2"}]))
    inode_b = (tmp_path / "b").stat().st_ino
    os.chmod(tmp_path / "a", 0o600)
    plan = files.plan(str(tmp_path), [{"name": "a", "content": "1"}, {"name": "b", "content": "3"}])
    assert [e["state"] for e in plan["files"]] == ["mode", "differs"]
    assert files.apply(plan) == ["a", "b"]
    assert mode_of(tmp_path / "a") == 0o644 and (tmp_path / "b").read_text() == "3"
    assert (tmp_path / "b").stat().st_ino != inode_b                  # renamed over, not rewritten in place


@pytest.mark.parametrize("spec,message", [
    ([{"name": "../x", "content": ""}], "files[0].name: '../x' is not a plain file name"),
    ([{"name": "..", "content": ""}], "files[0].name: '..' is not a plain file name"),
    ([{"name": "a", "content": ""}, {"name": "a", "content": "2"}], "files[1].name: 'a' is given twice"),
    ([{"name": "a"}], "files[0]: expected a mapping with name and content"),
    ([{"name": "a", "content": 3}], "files[0].content: expected text, got int"),
    ([{"name": "a", "content": "", "mode": "rw"}], "files[0].mode: 'rw' is not an octal mode"),
    ("a", "files: expected a list"),
])
def test_bad_input_is_named_and_nothing_is_written(tmp_path, spec, message):
    with pytest.raises(files.FilesError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        files.plan(str(tmp_path / "new"), spec)
    assert not (tmp_path / "new").exists()


def test_a_directory_in_the_way_or_a_relative_dir_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(files.FilesError, match="is not a regular file"):
        files.plan(str(tmp_path), [{"name": "d", "content": ""}])
    (tmp_path / "f").write_text("")
    with pytest.raises(files.FilesError, match="exists and is not a directory"):
        files.plan(str(tmp_path / "f"), [])
    with pytest.raises(files.FilesError, match="absolute path"):
        files.plan("rel/dir", [])


def test_diffs_show_each_written_file_and_skip_large_ones(tmp_path):
    (tmp_path / "old").write_text("before\n")
    plan = files.plan(str(tmp_path), [{"name": "old", "content": "after\n"}, {"name": "new", "content": "n\n"},
                                      {"name": "big", "content": "x" * (files.MAX_DIFF_BYTES + 1)}])
    out, diffs = files.result(plan)
    assert out["written"] == ["old", "new", "big"]
    by_name = {Path(d["after_header"]).name: d for d in diffs}
    assert by_name["old"]["before"] == "before\n" and by_name["old"]["after"] == "after\n"
    assert by_name["new"]["before_header"] == "/dev/null"
    assert "larger than the diff limit" in by_name["big"]["after"]


PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Write
      ddtree.fleet.controller_files:
        dir: "{{ out }}/evidence"
        dir_mode: "0750"
        mode: "0640"
        files:
          - name: summary.json
            content: "{{ {'host': inventory_hostname} | to_nice_json }}\\n"
          - name: journal.txt
            content: "{{ journal }}\\n"
      register: written
    - name: Keep the result
      ansible.builtin.copy:
        dest: "{{ result_file }}"
        content: "{{ written | to_json }}"
        mode: "0644"
      check_mode: false
"""


def play(tmp_path: Path, *args: str, journal: str = "j1") -> tuple[subprocess.CompletedProcess, dict]:
    (tmp_path / "play.yml").write_text(PLAY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_HOME": str(tmp_path / ".ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1"}
    run = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
                          "-e", json.dumps({"out": str(tmp_path / "out"), "journal": journal,
                                            "result_file": str(tmp_path / "result.json"),
                                            "ansible_python_interpreter": sys.executable}), *args,
                          str(tmp_path / "play.yml")], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run, json.loads((tmp_path / "result.json").read_text())


def test_the_action_plugin_writes_is_idempotent_and_check_mode_tells_the_truth(tmp_path):
    run, checked = play(tmp_path, "--check", "--diff")      # check mode: nothing written, the diff shows it
    assert not (tmp_path / "out" / "evidence").exists()
    assert checked["changed"] and checked["written"] == ["summary.json", "journal.txt"]
    assert "summary.json" in run.stdout and '"host": "localhost"' in run.stdout
    run, first = play(tmp_path)
    evidence = tmp_path / "out" / "evidence"
    assert first["changed"] and first["dir_created"] and first["written"] == ["summary.json", "journal.txt"]
    assert json.loads((evidence / "summary.json").read_text()) == {"host": "localhost"}
    assert mode_of(evidence) == 0o750 and mode_of(evidence / "journal.txt") == 0o640
    _, second = play(tmp_path)
    assert not second["changed"] and second["written"] == []
    run, third = play(tmp_path, "--diff", journal="j2")
    assert third["changed"] and third["written"] == ["journal.txt"]
    assert (evidence / "journal.txt").read_text() == "j2\n"
    assert "-j1" in run.stdout and "+j2" in run.stdout


def test_the_module_run_on_a_host_does_the_same(run_module, tmp_path):
    args = {"dir": str(tmp_path / "r"), "mode": "0600", "files": [{"name": "a.txt", "content": "A"}]}
    checked = run_module("controller_files", args, check_mode=True)
    assert not checked.failed and checked.result["changed"] and not (tmp_path / "r").exists()
    first = run_module("controller_files", args)
    assert first.result["changed"] and first.result["written"] == ["a.txt"]
    assert (tmp_path / "r" / "a.txt").read_text() == "A" and mode_of(tmp_path / "r" / "a.txt") == 0o600
    assert not run_module("controller_files", args).result["changed"]
    bad = run_module("controller_files", {"dir": str(tmp_path / "r"), "files": [{"name": "x/y", "content": ""}]})
    assert bad.failed and "files[0].name: 'x/y' is not a plain file name" in bad.result["msg"]
