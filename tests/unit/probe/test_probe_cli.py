"""bin/ddtree-probe through a subprocess: exit codes 0/1/2, JSON on stdout."""

import json
import os
import subprocess
import sys

from probe_testlib import REPO

CLI = os.path.join(REPO, "bin", "ddtree-probe")
QUICK = ["--stall-timeout", "2", "--ttft-timeout", "3", "--rate-window", "1"]


def run(args, env_extra=None, stdin=None):
    env = dict(os.environ)
    env.pop("DDTREE_PROBE_API_KEY", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, CLI] + args, capture_output=True, text=True,
                          env=env, input=stdin, timeout=60)


def test_cli_is_executable_with_python3_shebang():
    assert os.access(CLI, os.X_OK)
    with open(CLI) as fh:
        assert fh.readline().strip() == "#!/usr/bin/env python3"


def test_pass_exit_0_with_default_prompts_file(fake_server):
    srv = fake_server()
    p = run(["probe", "--url", srv.url] + QUICK)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["verdict"] == "pass"
    assert [x["name"] for x in rep["prompts"]] == ["arith", "capital", "primes", "code", "freeform"]


def test_fail_exit_1(fake_server):
    srv = fake_server()
    srv.beh.answer = lambda prompt: "!" * 8
    p = run(["probe", "--url", srv.url] + QUICK)
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["verdict"] == "fail"
    assert "FAIL" in p.stderr


def test_unreachable_exit_2(free_port):
    p = run(["probe", "--url", "http://127.0.0.1:%d" % free_port] + QUICK)
    assert p.returncode == 2
    assert json.loads(p.stdout)["verdict"] == "inconclusive"


def test_bad_arguments_exit_2(tmp_path):
    assert run(["probe"]).returncode == 2                                   # no --url
    assert run(["probe", "--url", "http://x", "--stall-timeout", "-1"]).returncode == 2
    assert run(["probe", "--url", "http://127.0.0.1:1", "--endpoint", "chat"]).returncode == 2
    p = run(["probe", "--url", "http://127.0.0.1:1", "--prompts", str(tmp_path / "missing.json")])
    assert p.returncode == 2 and "cannot read prompts file" in p.stderr and p.stdout == ""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert run(["probe", "--url", "http://127.0.0.1:1", "--prompts", str(bad)]).returncode == 2
    assert run(["probe", "--url", "not-a-url"]).returncode == 2
    assert run([]).returncode == 2


def test_api_key_from_env_is_sent_and_never_printed(fake_server):
    srv = fake_server()
    srv.beh.api_key = "env-secret-key-42"
    p = run(["probe", "--url", srv.url] + QUICK, env_extra={"DDTREE_PROBE_API_KEY": "env-secret-key-42"})
    assert p.returncode == 0, p.stdout
    assert "env-secret-key-42" not in p.stdout + p.stderr
    p2 = run(["probe", "--url", srv.url, "--api-key", "env-secret-key-42"] + QUICK)
    assert p2.returncode == 0
    assert "env-secret-key-42" not in p2.stdout + p2.stderr
    p3 = run(["probe", "--url", srv.url] + QUICK)            # no key: 401
    assert p3.returncode == 2
    assert "unauthorized" in json.loads(p3.stdout)["reasons"][0]


def test_custom_prompts_file_with_wrong_answer(fake_server, tmp_path):
    srv = fake_server()
    f = tmp_path / "p.json"
    f.write_text(json.dumps([{"prompt": "What is the capital of France? Answer in one word.",
                              "expect": "Lyon\\.?", "max_tokens": 8}]))
    p = run(["probe", "--url", srv.url, "--prompts", str(f)] + QUICK)
    assert p.returncode == 1
    assert "expect_mismatch" in json.loads(p.stdout)["reasons"][0]


def test_baseline_url(fake_server):
    base = fake_server()
    cand = fake_server()
    cand.beh.answer = lambda prompt: ("A tiny draft model guesses tokens and the big model "
                                      "checks them all at once, which is faster.")
    # Agreement only: two equally fast fakes' speed ratio is noise (the floor has its own test).
    f = ["--prompts", "/dev/stdin", "--min-speed-ratio", "0"]
    prompts = json.dumps([{"name": "free", "prompt": "Explain things.", "max_tokens": 64}])
    p = run(["probe", "--url", cand.url, "--baseline-url", base.url] + f + QUICK, stdin=prompts)
    # A fluent answer that is not the baseline's greedy text: a lossless violation, exit 1.
    assert p.returncode == 1, p.stdout
    rep = json.loads(p.stdout)
    assert rep["baseline"]["url"] == base.url
    assert rep["baseline"]["report"]["verdict"] == "pass"
    div = rep["baseline"]["prompts"][0]["first_divergence"]
    assert div["index"] == 0
    assert rep["reasons"][0].startswith("lossless_violation: free: diverges from the baseline "
                                        "at token 0")
    # Both servers were actually asked.
    assert base.beh.requests and cand.beh.requests
    # The same candidate passes against an identical baseline, and when the baseline's first
    # token was a near tie.
    same = run(["probe", "--url", base.url, "--baseline-url", base.url] + f + QUICK, stdin=prompts)
    assert same.returncode == 0, same.stdout
    base.beh.margin = lambda prompt, i: 0.1
    tie = run(["probe", "--url", cand.url, "--baseline-url", base.url] + f + QUICK, stdin=prompts)
    assert tie.returncode == 0, tie.stdout
    assert json.loads(tie.stdout)["warnings"][0].startswith("near_tie: free:")


def test_baseline_url_applies_the_gates_speed_floor(fake_server):
    """A correct server at a tenth of its baseline's speed fails from the CLI by default."""
    base = fake_server()
    cand = fake_server()
    base.beh.token_delay = 0.003
    cand.beh.token_delay = 0.03
    prompts = json.dumps([{"name": "free", "prompt": "Explain in a few sentences why "
                           "speculative decoding makes large language model inference faster.",
                           "max_tokens": 96}])
    f = ["--prompts", "/dev/stdin", "--min-tokens-per-s", "1"]
    p = run(["probe", "--url", cand.url, "--baseline-url", base.url] + f, stdin=prompts)
    assert p.returncode == 1, p.stdout
    rep = json.loads(p.stdout)
    assert rep["reasons"][0].startswith("speed_ratio:") and "< floor 0.5" in rep["reasons"][0]
    assert rep["thresholds"]["min_speed_ratio"] == 0.5
    off = run(["probe", "--url", cand.url, "--baseline-url", base.url, "--min-speed-ratio", "0"]
              + f, stdin=prompts)
    assert off.returncode == 0, off.stdout


def test_help_names_the_gate_defaults():
    out = run(["probe", "--help"]).stdout
    for text in ("--min-speed-ratio", "default 0.5, as the quality gate", "--agreement",
                 "default fail", "--near-tie-margin", "default 0.5"):
        assert text in " ".join(out.split()), text


def test_assess_jsonl_keeps_ids(tmp_path):
    f = tmp_path / "out.jsonl"
    rows = [
        {"id": "r1", "prompt": "2+2?", "output": "4", "expect": "4\\.?", "model": "m"},
        {"id": "r2", "prompt": "2+2?", "output": "!!!!!!!!", "output_ids": [0] * 8},
        {"id": 7, "prompt": "song", "output": "la la la, a refrain\nmore lines\nthe end"},
        {"prompt": "no id", "output": "the the the the the"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    p = run(["assess", str(f)])
    assert p.returncode == 1, p.stderr
    out = [json.loads(line) for line in p.stdout.splitlines()]
    assert [o["id"] for o in out] == ["r1", "r2", 7, 4]
    assert [o["verdict"] for o in out] == ["ok", "degenerate", "ok", "degenerate"]
    assert out[0]["model"] == "m"                        # other keys passed through
    assert any(r.startswith("token_id_run: id 0") for r in out[1]["reasons"])
    assert out[3]["reasons"][0].startswith("word_run")


def test_assess_all_ok_exit_0_from_stdin():
    p = run(["assess", "-"], stdin='{"id": 1, "prompt": "x", "output": "Paris."}\n')
    assert p.returncode == 0
    assert json.loads(p.stdout) == {"id": 1, "prompt": "x", "verdict": "ok",
                                    "text_verdict": "ok", "reasons": []}


def test_assess_bad_input_exit_2(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": 1, "output": "ok"}\nnot json\n')
    assert run(["assess", str(f)]).returncode == 2
    f.write_text('{"id": 1, "prompt": "p"}\n')          # no output
    assert run(["assess", str(f)]).returncode == 2
    assert run(["assess", str(tmp_path / "missing.jsonl")]).returncode == 2
