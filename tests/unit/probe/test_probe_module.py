"""plugins/modules/sglang_probe.py via patch_module_args, and once as a real ansible task."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.ddtree.fleet.plugins.module_utils.probe import run as ddtree_probe
from probe_testlib import REPO


FAST = dict(stall_timeout=2.0, ttft_timeout=3.0, rate_window_s=1.0)


class Exit(Exception):
    def __init__(self, result, failed):
        super().__init__(result)
        self.result = result
        self.failed = failed


def _load_module():
    spec = importlib.util.spec_from_file_location(
        "sglang_probe_under_test", os.path.join(REPO, "plugins", "modules", "sglang_probe.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def run_module(monkeypatch):
    mod = _load_module()

    def exit_json(self, **kw):
        raise Exit(kw, False)

    def fail_json(self, **kw):
        raise Exit(kw, True)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)

    def call(args):
        with patch_module_args(args):
            with pytest.raises(Exit) as ei:
                mod.main()
        return ei.value

    return call


def test_pass_result_shape(fake_server, run_module):
    srv = fake_server()
    res = run_module(dict(url=srv.url, **FAST))
    assert not res.failed
    r = res.result
    assert r["changed"] is False and r["verdict"] == "pass" and r["passed"] is True
    assert r["reasons"] == [] and r["report"]["verdict"] == "pass"


def test_check_mode_still_probes_and_reports_unchanged(fake_server, run_module):
    srv = fake_server()
    srv.beh.answer = lambda p: "!" * 8
    res = run_module(dict(url=srv.url, _ansible_check_mode=True, **FAST))
    assert not res.failed                      # a bad verdict does not fail by default
    assert res.result["changed"] is False
    assert res.result["verdict"] == "fail"
    assert srv.beh.requests                    # it really probed in check mode


def test_fail_on_fails_the_task(fake_server, run_module):
    srv = fake_server()
    srv.beh.mode = "http500"
    res = run_module(dict(url=srv.url, fail_on=["fail"], **FAST))
    assert res.failed
    assert "HTTP 500" in res.result["msg"]
    assert res.result["verdict"] == "fail" and res.result["changed"] is False


def test_fail_on_inconclusive(free_port, run_module):
    url = "http://127.0.0.1:%d" % free_port
    assert not run_module(dict(url=url, fail_on=["fail"], **FAST)).failed
    res = run_module(dict(url=url, fail_on=["fail", "inconclusive"], **FAST))
    assert res.failed and res.result["verdict"] == "inconclusive"


def test_api_key_sent_not_returned(fake_server, run_module):
    srv = fake_server()
    srv.beh.api_key = "mod-secret-9"
    res = run_module(dict(url=srv.url, api_key="mod-secret-9", **FAST))
    assert res.result["verdict"] == "pass"
    assert "mod-secret-9" not in json.dumps(res.result)


def test_custom_prompts_and_baseline(fake_server, run_module):
    srv = fake_server()
    prompts = [{"name": "arith", "prompt": "What is 2 + 2? Answer with a number only.",
                "expect": "4\\.?", "max_tokens": 8}]
    first = run_module(dict(url=srv.url, prompts=prompts, **FAST)).result
    second = run_module(dict(url=srv.url, prompts=prompts, baseline=first["report"],
                             **FAST)).result
    assert second["verdict"] == "pass"
    assert second["report"]["baseline"]["prompts"][0]["identical"] is True


def test_bad_prompts_fail_with_message(run_module):
    res = run_module(dict(url="http://127.0.0.1:1", prompts=[{"nope": 1}]))
    assert res.failed and "cannot run" in res.result["msg"]


def test_real_ansible_task_in_check_mode(fake_server, tmp_path):
    srv = fake_server()
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, "collections"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_HOME=str(tmp_path / "home"),
               ANSIBLE_STDOUT_CALLBACK="minimal", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    p = subprocess.run(
        [ansible, "-i", "localhost,", "-c", "local", "localhost", "--check",
         "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", "ddtree.fleet.sglang_probe",
         "-a", json.dumps({"url": srv.url, "api_key": "adhoc-secret", "stall_timeout": 2})],
        capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    # minimal callback: "localhost | SUCCESS => {json}"
    head, _, body = p.stdout.partition("=>")
    assert "SUCCESS" in head, p.stdout
    res = json.loads(body)
    assert res["changed"] is False
    assert res["verdict"] == "pass", res.get("reasons")
    assert "adhoc-secret" not in p.stdout


FRENCH = "Bonjour ! Peux-tu m'expliquer comment fonctionne une file d'attente ?"
ENGLISH = ("Sure. A queue holds items in the order they arrive and hands them out first in, "
           "first out.")


def _adhoc(srv, tmp_path, action_plugins, args=None):
    """The module run by a real `ansible` on the host's system python3 (the standard library only,
    as on a target host); with the repository's action plugin, the controller judges again."""
    # By its FQCN the module runs under the collection's action plugin; by its short name, from
    # ANSIBLE_LIBRARY, it runs alone (its module_utils still come from the collection).
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, "collections"),
               ANSIBLE_LIBRARY=os.path.join(REPO, "plugins", "modules"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"), ANSIBLE_HOME=str(tmp_path / "home"),
               ANSIBLE_STDOUT_CALLBACK="minimal", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    module = "ddtree.fleet.sglang_probe" if action_plugins else "sglang_probe"
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    args = args or {"url": srv.url, "stall_timeout": 2, "prompts": [{"name": "fr", "prompt": FRENCH}]}
    p = subprocess.run(
        [ansible, "-i", "localhost,", "-c", "local", "localhost",
         "-e", "ansible_python_interpreter=/usr/bin/python3", "-m", module,
         "-a", json.dumps(args)], capture_output=True, text=True, env=env, timeout=120)
    head, _, body = p.stdout.partition("=>")
    assert "SUCCESS" in head or "FAILED" in head, p.stdout + p.stderr
    return json.loads(body)


def test_controller_judges_the_hosts_outputs_again(fake_server, tmp_path):
    if subprocess.run(["/usr/bin/python3", "-c", "import pycld2"],
                      capture_output=True).returncode == 0:
        pytest.skip("the system python3 has pycld2: it is no stdlib-only host")
    srv = fake_server()
    srv.beh.answer = lambda prompt: ENGLISH
    host_only = _adhoc(srv, tmp_path, action_plugins=False)
    assert host_only["verdict"] == "pass", host_only.get("reasons")
    assert host_only["report"]["text_judges"]["probe"]["library_backed"] is False
    judged = _adhoc(srv, tmp_path, action_plugins=True)
    assert judged["verdict"] == "fail" and judged["passed"] is False
    assert judged["reasons"][0].startswith("fr: degenerate: language_switch"), judged["reasons"]
    tj = judged["report"]["text_judges"]
    assert tj["controller"]["library_backed"] is True and tj["controller_failed"]
    assert judged["report"]["prompts"][0]["verdict"] == "fail"


def test_settings_are_merged_under_the_calls_own_options(fake_server, tmp_path):
    # The gate, the baseline and the restore handler pass quality_gate_probe_settings once; the
    # action plugin puts them under the task's own options and drops an empty api_key.
    srv = fake_server()
    # A floor no server reaches (1000 was: the fake streams its short answer faster than that
    # when the machine is idle, seen in CI), so the merged setting must fail the probe.
    settings = {"url": srv.url, "api_key": "", "stall_timeout": 2, "min_tokens_per_s": 1e7,
                "prompts": [{"name": "ordinary", "prompt": "Say something ordinary."}]}
    slow = _adhoc(srv, tmp_path, action_plugins=True, args={"settings": settings})
    assert slow["report"]["url"] == srv.url and [p["name"] for p in slow["report"]["prompts"]] == ["ordinary"]
    assert slow["verdict"] == "fail" and any("tokens/s < floor 1e+07" in r for r in slow["reasons"]), slow["reasons"]
    own = _adhoc(srv, tmp_path, action_plugins=True, args={"settings": settings, "min_tokens_per_s": 0.001})
    assert own["verdict"] == "pass", own.get("reasons")
    assert srv.beh.requests and not any("Authorization" in headers for _, headers, _ in srv.beh.requests)


def test_the_module_alone_refuses_settings(fake_server, tmp_path):
    srv = fake_server()
    res = _adhoc(srv, tmp_path, action_plugins=False, args={"settings": {"url": srv.url}})
    assert "verdict" not in res and "action plugin" in res["msg"], res
