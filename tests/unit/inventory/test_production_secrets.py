"""inventory/production: the vault loads as documented, and a run without a key stops before any host.

A copy of inventory/production (same files, plus what each test adds) is read by real Ansible on
the controller. The production hosts are TEST-NET placeholders nobody answers: a check that did not
stop the run before its first connection would show up as UNREACHABLE.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = REPO / ".venv" / "bin"
pytestmark = pytest.mark.skipif(not (BIN / "ansible-playbook").exists(), reason="no .venv")


@pytest.fixture
def inventory(tmp_path):
    inv = tmp_path / "production"
    shutil.copytree(REPO / "inventory" / "production", inv)
    return inv


def env(**extra):
    out = {k: v for k, v in os.environ.items() if k not in ("SGLANG_API_KEY", "HF_TOKEN")}
    out.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **extra)
    return out


def vault(inv: Path, where: str, tmp_path: Path, **values) -> Path:
    password = tmp_path / "vault-password"
    password.write_text(secrets.token_hex(16))
    path = inv / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    subprocess.run([str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password), str(path)],
                   check=True, capture_output=True, env=env(), timeout=60)
    assert "$ANSIBLE_VAULT" in path.read_text()
    return password


def key_of(inv: Path, *args: str, **extra_env) -> str:
    res = subprocess.run([str(BIN / "ansible"), "ct129", "-i", str(inv), "-c", "local", "-o",
                          "-m", "ansible.builtin.debug", "-a", "msg=key=[{{ sglang_api_key }}]", *args],
                         capture_output=True, text=True, env=env(**extra_env), timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.split("key=[", 1)[1].split("]", 1)[0]


def test_the_documented_vault_file_is_read_for_every_host(inventory, tmp_path):
    password = vault(inventory, "group_vars/all/vault.yml", tmp_path, vault_sglang_api_key="from-the-vault")
    assert key_of(inventory, "--vault-password-file", str(password)) == "from-the-vault"
    # The vault wins over the environment; without a vault the environment is read.
    assert key_of(inventory, "--vault-password-file", str(password), SGLANG_API_KEY="from-env") == "from-the-vault"


def test_without_a_vault_the_environment_is_read(inventory):
    assert key_of(inventory, SGLANG_API_KEY="from-env") == "from-env"
    assert key_of(inventory) == ""


def test_the_old_documented_place_would_not_have_loaded(inventory, tmp_path):
    """group_vars/vault.yml is the vars of a group named "vault": the production hosts never saw it."""
    password = vault(inventory, "group_vars/vault.yml", tmp_path, vault_sglang_api_key="from-the-vault")
    assert key_of(inventory, "--vault-password-file", str(password)) == ""


def deploy(inv: Path, *args: str, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "deploy_ddtree.yml", "-l", "ct129", *args],
                          capture_output=True, text=True, env=env(**extra_env), timeout=300, cwd=REPO)


def test_a_production_run_without_a_key_stops_before_it_connects(inventory):
    res = deploy(inventory)
    assert res.returncode == 2, res.stdout[-3000:]
    assert "ct129: sglang_api_key is empty (sglang_api_key_required is true in this inventory)" in res.stdout
    assert "-e sglang_api_key_required=false" in res.stdout
    assert "UNREACHABLE" not in res.stdout and "Read the host's declared and live state" not in res.stdout


def test_no_key_is_refused_on_a_non_loopback_address_even_when_opted_out(inventory):
    res = deploy(inventory, "-e", "sglang_api_key_required=false", "-e", "sglang_host=0.0.0.0")
    assert res.returncode == 2, res.stdout[-3000:]
    assert "ct129: sglang_api_key is empty (sglang_host=0.0.0.0 is not a loopback address)" in res.stdout
    assert "sglang_api_key_required=false to serve" not in res.stdout
    assert "UNREACHABLE" not in res.stdout


def test_a_key_that_the_key_file_cannot_hold_is_refused_up_front(inventory):
    res = deploy(inventory, SGLANG_API_KEY='bad"key')
    assert res.returncode == 2, res.stdout[-3000:]
    assert "sglang_api_key=<hidden> (string): expected a string (letters, digits and ._~+/=:@- only" in res.stdout
    assert 'bad"key' not in res.stdout and "UNREACHABLE" not in res.stdout


def test_a_typo_in_an_extra_var_stops_the_run_before_it_connects(inventory):
    res = deploy(inventory, "-e", "sglang_mem_fracton_static=0.8", SGLANG_API_KEY="k")
    assert res.returncode == 2, res.stdout[-3000:]
    assert "sglang_mem_fracton_static: no role or playbook of ddtree-fleet reads this variable" in res.stdout
    assert "did you mean sglang_mem_fraction_static?" in res.stdout
    assert "UNREACHABLE" not in res.stdout
