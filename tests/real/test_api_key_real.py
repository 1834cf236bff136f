"""The API keys reach the real sglang 0.5.23 through a ``--config`` file, never through argv.

The unit's ExecStartPre (roles/sglang_service/templates/sglang.service.j2) is taken from the
template, unescaped the way systemd unquotes an ExecStartPre= line for these characters
(``%%`` and ``$$``, then the double-quoted word's backslash escapes), and run with /bin/sh and the
key in its environment, as systemd runs it from the EnvironmentFile. The argv the product renders
(plugins/module_utils/flags.py) is then parsed by the real ``prepare_server_args``: the key it
resolves is the key, and no argument holds the key; with no admin key declared, a random one closes
SGLang's admin endpoints to the client key under the real auth rules (``decide_request_auth``). Real systemd's own unquoting of that line is
executed in the lab (tests/integration/lab/test_lab_12_secrets.py).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import jinja2
import pytest

from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils.auth import AuthLevel, decide_request_auth

from realkit import TARGET

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "roles" / "sglang_service" / "templates" / "sglang.service.j2"


def _flags():
    """The product's argv builder (pure Python), loaded from its file: this venv has no Ansible."""
    spec = importlib.util.spec_from_file_location("ddtree_flags", REPO / "plugins" / "module_utils" / "flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_key_file(path: Path, key: str, admin: str = "") -> None:
    """Render the template's ExecStartPre line for these keys and run it as systemd would."""
    line = re.search(r"^ExecStartPre=(.*)$", TEMPLATE.read_text(), re.M).group(1)
    line = jinja2.Template(line).render(sglang_api_key=key, sglang_admin_api_key=admin,
                                        sglang_config_api_key_file=str(path))
    line = line.replace("%%", "%").replace("$$", "$")
    argv = shlex.split(line)
    assert argv[:2] == ["/bin/sh", "-c"] and (not key or key not in line) and (not admin or admin not in line), argv
    env = {"PATH": "/usr/bin:/bin", "SGLANG_API_KEY": key, "SGLANG_ADMIN_API_KEY": admin}
    subprocess.run(argv, env=env, check=True, timeout=30)


def parsed(mirror, path: Path):
    flags = _flags()
    argv = flags.sglang_argv({"model_path": str(mirror[TARGET]), "algorithm": "NEXTN", "host": "127.0.0.1",
                              "port": 30000, "tp_size": 1, "api_key_set": True, "api_key_config": str(path)})
    assert argv[-2:] == ["--config", str(path)], argv
    return argv, prepare_server_args(argv + ["--device", "cuda"])


@pytest.mark.parametrize("key", ["plain", "Ab0._~+/=:@-", "x" * 128])
def test_the_real_parser_reads_the_key_from_the_file_the_unit_writes(mirror, tmp_path, key):
    path = tmp_path / "api-key.yaml"
    write_key_file(path, key)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    argv, args = parsed(mirror, path)
    assert not any(key in a for a in argv), argv
    assert args.api_key == key
    # No admin key declared: a random one nobody holds (64 hex digits, new at every start).
    assert re.fullmatch(r"[0-9a-f]{64}", args.admin_api_key), args.admin_api_key
    write_key_file(path, key)
    assert parsed(mirror, path)[1].admin_api_key != args.admin_api_key


def test_admin_endpoints_refuse_the_client_key_under_the_real_auth_rules(mirror, tmp_path):
    """The real decide_request_auth with the keys the real parser resolved from the unit's file."""
    path = tmp_path / "api-key.yaml"
    for admin in ("", "the-admin-key"):
        write_key_file(path, "the-client-key", admin)
        args = parsed(mirror, path)[1]
        if admin:
            assert args.admin_api_key == admin

        def allowed(level, token, route="/update_weights_from_disk"):
            return decide_request_auth(method="POST", path=route, authorization_header=f"Bearer {token}",
                                       api_key=args.api_key, admin_api_key=args.admin_api_key,
                                       auth_level=level).allowed

        assert not allowed(AuthLevel.ADMIN_OPTIONAL, "the-client-key")
        assert not allowed(AuthLevel.ADMIN_FORCE, "the-client-key")
        assert allowed(AuthLevel.NORMAL, "the-client-key", "/generate")
        assert allowed(AuthLevel.ADMIN_OPTIONAL, admin) is bool(admin)
    # What the unit did before (only --api-key): the client key opened the admin endpoints.
    assert decide_request_auth(method="POST", path="/update_weights_from_disk", authorization_header="Bearer k",
                               api_key="k", admin_api_key=None, auth_level=AuthLevel.ADMIN_OPTIONAL).allowed


def test_without_the_file_the_real_server_refuses_to_start(mirror, tmp_path):
    """A unit whose ExecStartPre did not run (or wrote elsewhere) fails at the parser, not open."""
    flags = _flags()
    argv = flags.sglang_argv({"model_path": str(mirror[TARGET]), "algorithm": "NEXTN", "api_key_set": True,
                              "api_key_config": str(tmp_path / "absent.yaml")})
    with pytest.raises(ValueError, match="Config file not found"):
        prepare_server_args(argv + ["--device", "cuda"])
