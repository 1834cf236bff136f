"""The stand-in logs like sglang 0.5.23: configure_logger's set-up, and the engine's server_args line
with the API key in clear, which the product's logging config (role sglang_service) keeps out."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jinja2
import pytest

from conftest import REPO, STANDIN_SRC
from sglang_lab_standin import cli, logconfig
from standin_testlib import wait_for

KEY = "lab-canary-key-0123456789"
LOG_TEMPLATE = REPO / "roles" / "sglang_service" / "templates" / "sglang-logging.json.j2"
TIME = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]"


def product_logging_config(path, level="info"):
    """The role's logging config, rendered as the role renders it (only one variable)."""
    text = jinja2.Environment(loader=jinja2.FileSystemLoader(str(LOG_TEMPLATE.parent)), trim_blocks=True) \
        .get_template(LOG_TEMPLATE.name).render(sglang_service_log_level=level)
    path.write_text(text)
    return json.loads(text)


def run_logging(argv, env=None, extra=""):
    """configure_logger + the server_args line in a fresh interpreter (logging is process-global)."""
    code = ("import sys, logging\n"
            "from sglang_lab_standin import cli, logconfig\n"
            "args = cli.parse_args(sys.argv[1:])\n"
            "logconfig.configure_logger(args.log_level)\n"
            "logconfig.log_server_args(args)\n" + extra)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update({"PYTHONPATH": str(STANDIN_SRC)}, **(env or {}))
    return subprocess.run([sys.executable, "-c", code, "--model-path", "x", *argv], env=full_env,
                          capture_output=True, text=True, timeout=30)


def test_server_args_for_logging_keeps_keys_and_redacts_only_watermark_secrets():
    args = cli.parse_args(["--model-path", "x", "--api-key", KEY, "--admin-api-key", "adm1n",
                           "--ssl-keyfile-password", "pw", "--watermark-config", '{"key": "wm"}'])
    out = logconfig.server_args_for_logging(args)
    assert out["api_key"] == KEY and out["admin_api_key"] == "adm1n" and out["ssl_keyfile_password"] == "pw"
    assert out["watermark_config"] == "<redacted>"
    assert set(out) == set(vars(args))
    # Like redact_watermark_secrets on the resolved dict: the key is redacted even when unset.
    assert logconfig.server_args_for_logging(cli.parse_args(["--model-path", "x"]))["watermark_config"] == "<redacted>"


def test_launch_command_keeps_keys_and_redacts_only_the_watermark_config():
    argv = ["--model-path", "x", "--api-key", KEY, "--watermark-config", '{"key": "wm"}', "--port", "30000"]
    assert logconfig.launch_command(argv, '{"key": "wm"}') == (
        f"--model-path x --api-key {KEY} --watermark-config <redacted> --port 30000")
    assert logconfig.launch_command(["--watermark-config={\"k\": 1}", "--api-key", KEY], '{"k": 1}') == (
        f"--watermark-config=<redacted> --api-key {KEY}")
    assert logconfig.launch_command([]) == ""


def test_default_set_up_is_basic_config_at_log_level_with_the_key_in_clear():
    res = run_logging(["--api-key", KEY], extra="logging.getLogger('httpx').info('hidden')\n"
                                                 "logging.getLogger('other').info('shown')\n")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert re.fullmatch(TIME + r" server_args=\{'model_path': 'x', .*'api_key': '" + KEY + "'.*\\}", lines[0]), lines
    assert re.fullmatch(TIME + " shown", lines[1]) and len(lines) == 2, lines
    assert res.stdout == ""


def test_log_level_and_log_ms_are_honoured():
    assert run_logging(["--api-key", KEY, "--log-level", "warning"]).stderr == ""
    res = run_logging([], env={"SGLANG_LOG_MS": "1"})
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] server_args=\{", res.stderr), res.stderr


def test_missing_logging_config_raises_the_real_error(tmp_path):
    missing = tmp_path / "nope.json"
    res = run_logging([], env={"SGLANG_LOGGING_CONFIG_PATH": str(missing)})
    assert res.returncode == 1
    assert res.stderr.splitlines()[-1] == (
        f"Exception: Setting SGLANG_LOGGING_CONFIG_PATH from env with {missing} but it does not exist!")


def test_logging_config_replaces_the_set_up_and_log_level(tmp_path):
    conf = tmp_path / "logging.json"
    conf.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"f": {"format": "CUSTOM %(name)s %(message)s"}},
        "handlers": {"h": {"class": "logging.StreamHandler", "formatter": "f", "stream": "ext://sys.stdout"}},
        "root": {"level": "DEBUG", "handlers": ["h"]}}))
    res = run_logging(["--api-key", KEY, "--log-level", "error"], env={"SGLANG_LOGGING_CONFIG_PATH": str(conf)},
                      extra="logging.getLogger('httpx').debug('httpx not quieted')\n")
    assert res.stderr == ""
    assert res.stdout.startswith(f"CUSTOM {logconfig.ENGINE_LOGGER} server_args={{'model_path': 'x'"), res.stdout
    assert KEY in res.stdout and "CUSTOM httpx httpx not quieted" in res.stdout


def test_product_logging_config_keeps_the_key_out_and_the_rest_as_sglang_logs_it(tmp_path):
    conf = tmp_path / "sglang-logging.json"
    doc = product_logging_config(conf)
    assert doc["disable_existing_loggers"] is False
    assert doc["loggers"][logconfig.ENGINE_LOGGER]["level"] == "WARNING"
    res = run_logging(["--api-key", KEY], env={"SGLANG_LOGGING_CONFIG_PATH": str(conf)},
                      extra="logging.getLogger('sglang.srt.entrypoints.http_server').info('ready')\n"
                            "logging.getLogger('sglang.srt.entrypoints.engine').warning('engine warning')\n"
                            "logging.getLogger('httpx').info('quiet')\n"
                            "logging.getLogger('x').debug('debug hidden')\n")
    assert res.returncode == 0 and res.stdout == "", res
    lines = res.stderr.splitlines()
    assert KEY not in res.stderr and "server_args" not in res.stderr
    assert len(lines) == 2 and re.fullmatch(TIME + " ready", lines[0]) and re.fullmatch(TIME + " engine warning",
                                                                                        lines[1]), lines


def test_standin_logs_the_key_in_clear_without_a_logging_config(launch):
    s = launch(api_key=KEY)
    wait_for(lambda: "Load weight begin" in s.log, 10)
    line = next(x for x in s.log.splitlines() if "server_args=" in x)
    assert re.match(TIME + r" server_args=\{'model_path': '/models/lab-27b'", line), line
    assert f"'api_key': '{KEY}'" in line


def test_standin_with_the_products_logging_config_serves_without_the_key_in_its_log(launch, tmp_path):
    conf = tmp_path / "sglang-logging.json"
    product_logging_config(conf)
    s = launch(api_key=KEY, env={"SGLANG_LOGGING_CONFIG_PATH": str(conf)}).wait_ready()
    assert "The server is fired up and ready to roll!" in s.log and "Load weight begin" in s.log
    assert KEY not in s.log and "server_args=" not in s.log


def test_standin_fails_to_start_on_a_missing_logging_config(launch, tmp_path):
    missing = tmp_path / "gone.json"
    s = launch(api_key=KEY, env={"SGLANG_LOGGING_CONFIG_PATH": str(missing)})
    assert s.proc.wait(timeout=20) == 1
    assert "Traceback (most recent call last):" in s.log
    assert (f"Exception: Setting SGLANG_LOGGING_CONFIG_PATH from env with {missing} but it does not exist!"
            in s.log)
    assert "Load weight begin" not in s.log and KEY not in s.log


@pytest.mark.parametrize("level", ["debug", "warning"])
def test_product_logging_config_level_is_the_roles_variable(tmp_path, level):
    doc = product_logging_config(tmp_path / "c.json", level)
    assert doc["root"]["level"] == level.upper()
    assert doc["loggers"][logconfig.ENGINE_LOGGER]["level"] == "WARNING"
