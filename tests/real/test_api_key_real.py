"""The API key reaches the real sglang 0.5.23 through a ``--config`` file, never through argv.

The unit's ExecStartPre (roles/sglang_service/templates/sglang.service.j2) is taken from the
template, unescaped the way systemd unquotes an ExecStartPre= line for these characters
(``%%`` and ``$$``, then the double-quoted word's backslash escapes), and run with /bin/sh and the
key in its environment, as systemd runs it from the EnvironmentFile. The argv the product renders
(plugins/module_utils/flags.py) is then parsed by the real ``prepare_server_args``: the key it
resolves is the key, and no argument holds the key. Real systemd's own unquoting of that line is
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

import pytest

from sglang.srt.server_args import prepare_server_args

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "roles" / "sglang_service" / "templates" / "sglang.service.j2"
TARGET = "Qwen/Qwen3.6-27B"


def _flags():
    """The product's argv builder (pure Python), loaded from its file: this venv has no Ansible."""
    spec = importlib.util.spec_from_file_location("ddtree_flags", REPO / "plugins" / "module_utils" / "flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_key_file(path: Path, key: str) -> None:
    line = re.search(r"^ExecStartPre=(.*)$", TEMPLATE.read_text(), re.M).group(1)
    line = line.replace("{{ sglang_config_api_key_file }}", str(path)).replace("%%", "%").replace("$$", "$")
    argv = shlex.split(line)
    assert argv[:2] == ["/bin/sh", "-c"] and key not in line, argv
    env = {"PATH": "/usr/bin:/bin", "SGLANG_API_KEY": key}
    subprocess.run(argv, env=env, check=True, timeout=30)


@pytest.mark.parametrize("key", ["plain", "Ab0._~+/=:@-", "x" * 128])
def test_the_real_parser_reads_the_key_from_the_file_the_unit_writes(mirror, tmp_path, key):
    path = tmp_path / "api-key.yaml"
    write_key_file(path, key)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    flags = _flags()
    argv = flags.sglang_argv({"model_path": str(mirror[TARGET]), "algorithm": "NEXTN", "host": "127.0.0.1",
                              "port": 30000, "tp_size": 1, "api_key_set": True, "api_key_config": str(path)})
    assert argv[-2:] == ["--config", str(path)] and not any(key in a for a in argv), argv
    args = prepare_server_args(argv + ["--device", "cuda"])
    assert args.api_key == key
    assert args.admin_api_key is None


def test_without_the_file_the_real_server_refuses_to_start(mirror, tmp_path):
    """A unit whose ExecStartPre did not run (or wrote elsewhere) fails at the parser, not open."""
    flags = _flags()
    argv = flags.sglang_argv({"model_path": str(mirror[TARGET]), "algorithm": "NEXTN", "api_key_set": True,
                              "api_key_config": str(tmp_path / "absent.yaml")})
    with pytest.raises(ValueError, match="Config file not found"):
        prepare_server_args(argv + ["--device", "cuda"])
