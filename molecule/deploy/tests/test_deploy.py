"""Verify what deploy_ddtree.yml left on the scenario's hosts (dep-a sm86 NEXTN, dep-b sm120 DDTREE).

Expected values are derived independently of the roles where possible: the patch-set fingerprint
from roles/sglang/files/patches (series + SHA256SUMS), the known-good fingerprint from the unit and
environment file and logging config actually installed on the host.
"""

import hashlib
import importlib.util
import json
import os
import shlex

import pytest

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".."))

EXPECTED = {
    "dep-a": {"arch": "sm86", "algorithm": "NEXTN", "tp": "2", "mem": "0.85", "attention": "flashinfer",
              "draft": False},
    "dep-b": {"arch": "sm120", "algorithm": "DDTREE", "tp": "1", "mem": "0.9", "attention": "triton",
              "draft": True},
}
TARGET = ("Qwen/Qwen3.6-27B", "cc771039f153425de31921a0cd964651b8652914")
DRAFT = ("z-lab/Qwen3.6-27B-DFlash", "d39dc817302d4258a2161e9c3e5465a2ed620951")
MODELS_ROOT = "/opt/sglang/models"
UNIT = "/etc/systemd/system/sglang.service"
ENV_FILE = "/etc/sglang/sglang.env"
LOGGING_CONFIG = "/etc/sglang/sglang-logging.json"
STATE = "/var/lib/ddtree-fleet"
BASE_URL = "http://127.0.0.1:30000"
# Files that must mention DDTREE for the stand-in to treat the tree as DFLASH-family (docs/lab-physics.md).
DDTREE_DFLASH_FILES = [
    "speculative/spec_info.py", "speculative/spec_utils.py", "arg_groups/validation_hook.py",
    "arg_groups/kv_cache_hook.py", "arg_groups/speculative_hook.py", "arg_groups/lora_hook.py",
    "mem_cache/kv_cache_configurator.py",
]


def _load(relpath):
    spec = importlib.util.spec_from_file_location(f"_mol_{relpath.replace('/', '_')}",
                                                  os.path.join(PROJECT, "plugins", "module_utils", f"{relpath}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _patch_entries():
    pdir = os.path.join(PROJECT, "roles", "sglang", "files", "patches")
    sums = {}
    for line in open(os.path.join(pdir, "SHA256SUMS")):
        if line.strip():
            digest, name = line.split()
            sums[name.lstrip("*")] = digest
    names = [l.strip() for l in open(os.path.join(pdir, "series")) if l.strip() and not l.startswith("#")]
    return [{"name": n, "sha256": sums[n]} for n in names]


PATCHES = _patch_entries()
PATCHSET = _load("patch/series").patchset_fingerprint(PATCHES)
# The lab's hash lock (inventory/lab: written by lab/labctl.py with the mirror); the venv's name
# carries the sha256 of its text as Ansible's file lookup reads it (trailing whitespace stripped).
LOCK = os.path.join(os.environ.get("DDTREE_LAB_CACHE", "/var/cache/ddtree-lab"), "mirror", "requirements-lab.lock")
LOCK_ID = hashlib.sha256(open(LOCK, encoding="utf-8").read().rstrip().encode()).hexdigest()[:10]
VENV = f"/opt/sglang/venvs/0.5.23-{PATCHSET}-lock-{LOCK_ID}"
SITE = f"{VENV}/lib/python3.11/site-packages"


def _name(host):
    return host.ansible.get_variables()["inventory_hostname"]


def _exp(host):
    return EXPECTED[_name(host)]


def _model_dir(repo, rev):
    return f"{MODELS_ROOT}/{repo.replace('/', '--')}/{rev}"


def _exec_argv(host):
    lines = [l for l in host.file(UNIT).content_string.splitlines() if l.startswith("ExecStart=")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0][len("ExecStart="):])


def _flag(argv, flag):
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


# ------------------------------------------------------------------ venv

def test_versioned_venv(host):
    assert host.file(VENV).is_directory
    assert not host.file(VENV + ".partial").exists
    assert host.file(f"{VENV}/bin/python").exists
    assert host.file(f"{SITE}/sglang-0.5.23.dist-info").is_directory
    record = json.loads(host.file(f"{VENV}/.ddtree-venv.json").content_string)
    assert record["patchset"] == PATCHSET
    assert record["version"] == "0.5.23"
    assert record["requirements_lock"] == {"path": LOCK, "id": LOCK_ID}
    assert host.file(f"{VENV}/ddtree-requirements.lock").content_string == open(LOCK, encoding="utf-8").read()
    # Only one venv: the deploy built exactly the declared version + patch set.
    assert host.check_output("ls /opt/sglang/venvs").split() == [os.path.basename(VENV)]


def test_patchset_stamp(host):
    stamp = json.loads(host.file(f"{SITE}/sglang/.ddtree-patchset.json").content_string)
    assert stamp["fingerprint"] == PATCHSET
    assert [{"name": p["name"], "sha256": p["sha256"]} for p in stamp["patches"]] == PATCHES


def test_ddtree_registered_in_sglang(host):
    assert "DDTREE" in host.file(f"{SITE}/sglang/srt/speculative/spec_info.py").content_string


@pytest.mark.parametrize("rel", DDTREE_DFLASH_FILES)
def test_ddtree_dflash_family_patched(host, rel):
    assert host.file(f"{SITE}/sglang/srt/{rel}").contains("DDTREE")


# ------------------------------------------------------------------ weights

def _check_model(host, repo, rev):
    d = _model_dir(repo, rev)
    assert not host.file(d + ".partial").exists
    verified = json.loads(host.file(f"{d}/.ddtree-verified.json").content_string)
    assert (verified["repo_id"], verified["revision"], verified["source"]) == (repo, rev, "mirror")
    manifest_text = host.file(f"{d}/manifest.json").content_string
    assert hashlib.sha256(manifest_text.encode()).hexdigest() == verified["manifest_sha256"]
    files = json.loads(manifest_text)["files"]
    assert verified["files"] == len(files)
    sums = host.check_output("cd %s && sha256sum %s" % (shlex.quote(d), " ".join(shlex.quote(f["path"]) for f in files)))
    got = {line.split(None, 1)[1].lstrip("*"): line.split()[0] for line in sums.splitlines()}
    assert got == {f["path"]: f["sha256"] for f in files}
    return verified


def test_target_weights_verified(host):
    v = _check_model(host, *TARGET)
    assert v["manifest_sha256"] == host.ansible.get_variables()["sglang_model_manifest_sha256"]


def test_draft_weights_only_where_needed(host):
    d = _model_dir(*DRAFT)
    if _exp(host)["draft"]:
        v = _check_model(host, *DRAFT)
        assert v["manifest_sha256"] == host.ansible.get_variables()["sglang_draft_manifest_sha256"]
    else:  # NEXTN uses the target's own MTP layers: no draft is fetched
        assert not host.file(d).exists


# ------------------------------------------------------------------ unit and environment

def test_unit_flags_per_architecture(host):
    exp = _exp(host)
    argv = _exec_argv(host)
    assert argv[:3] == [f"{VENV}/bin/python", "-m", "sglang_lab_standin"]
    assert _flag(argv, "--model-path") == _model_dir(*TARGET)
    assert _flag(argv, "--tp-size") == exp["tp"]
    assert _flag(argv, "--mem-fraction-static") == exp["mem"]
    assert _flag(argv, "--attention-backend") == exp["attention"]
    assert _flag(argv, "--speculative-algorithm") == exp["algorithm"]
    assert _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--port") == "30000"
    if exp["draft"]:
        assert _flag(argv, "--speculative-draft-model-path") == _model_dir(*DRAFT)
    else:
        assert "--speculative-draft-model-path" not in argv
    text = host.file(UNIT).content_string
    assert f"speculative algorithm {exp['algorithm']} ({exp['arch']} settings)" in text


def test_unit_runs_as_sglang(host):
    unit = host.file(UNIT)
    assert (unit.user, unit.group, unit.mode) == ("root", "root", 0o644)
    lines = unit.content_string.splitlines()
    assert "User=sglang" in lines
    assert "Group=sglang" in lines
    assert f"EnvironmentFile={ENV_FILE}" in lines


def test_env_file_is_private(host):
    env = host.file(ENV_FILE)
    assert env.is_file
    assert (env.user, env.group, env.mode) == ("sglang", "sglang", 0o600)
    assert host.file("/etc/sglang").mode == 0o750


def test_service_active_and_enabled(host):
    svc = host.service("sglang.service")
    assert svc.is_running
    assert svc.is_enabled
    assert host.socket("tcp://127.0.0.1:30000").is_listening


def test_service_process_is_not_root(host):
    pid = int(host.check_output("systemctl show -p MainPID --value sglang.service"))
    assert pid > 0
    assert host.check_output(f"stat -c %U /proc/{pid}") == "sglang"
    assert host.user("sglang").uid != 0
    cmdline = host.file(f"/proc/{pid}/cmdline").content_string.split("\0")
    assert _flag(cmdline, "--speculative-algorithm") == _exp(host)["algorithm"]


def test_health_answers_200(host):
    code = host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 {BASE_URL}/health")
    assert code == "200"


def test_server_runs_the_declared_settings(host):
    exp = _exp(host)
    info = json.loads(host.check_output(f"curl -fsS --max-time 10 {BASE_URL}/server_info"))
    assert info["mem_fraction_static"] == float(exp["mem"])
    assert str(info["tp_size"]) == exp["tp"]
    assert info["attention_backend"] == exp["attention"]
    assert info["speculative_algorithm"] == exp["algorithm"]


# ------------------------------------------------------------------ known-good record

def test_known_good_points_at_deployed_fingerprint(host):
    unit_text = host.file(UNIT).content_string
    env_text = host.file(ENV_FILE).content_string
    logging_text = host.file(LOGGING_CONFIG).content_string
    fingerprint = _load("flags").config_fingerprint(unit_text, env_text, logging_text)
    link = host.file(f"{STATE}/known-good")
    assert link.is_symlink
    assert link.linked_to == f"{STATE}/records/{fingerprint}"
    meta = json.loads(host.file(f"{STATE}/known-good/meta.json").content_string)
    exp = _exp(host)
    assert meta["fingerprint"] == fingerprint
    assert (meta["algorithm"], meta["arch_group"], meta["venv"]) == (exp["algorithm"], exp["arch"], VENV)
    assert meta["gate"]["verdict"] == "pass"
    assert host.file(f"{STATE}/known-good/unit").content_string == unit_text
    assert meta["unit_sha256"] == hashlib.sha256(unit_text.encode()).hexdigest()
    assert meta["env_sha256"] == hashlib.sha256(env_text.encode()).hexdigest()
    assert meta["logging_sha256"] == hashlib.sha256(logging_text.encode()).hexdigest()


def test_nothing_quarantined(host):
    # The quarantine directory is made by the first rollback (role known_good); none here.
    assert host.check_output(f"find {STATE} -mindepth 2 -maxdepth 2 -path '{STATE}/quarantine/*'") == ""
