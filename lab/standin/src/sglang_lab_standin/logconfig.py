"""Python logging set up the way sglang 0.5.23 sets it up, and its start-up ``server_args`` line.

What the real server does (read from the 0.5.23 wheel):

* ``sglang/srt/utils/common.py`` ``configure_logger(server_args, prefix="")``, called when the
  engine starts: when the environment names a logging config (``SGLANG_LOGGING_CONFIG_PATH``),
  a missing file is an ``Exception`` with the message built in ``missing_config_message``;
  otherwise the file is read as JSON, handed to ``logging.config.dictConfig`` and nothing else
  is configured.  Without the variable: ``logging.basicConfig`` at ``--log-level`` with the
  format ``[%(asctime)s{prefix}] %(message)s`` (``.%(msecs)03d`` after the time when
  ``SGLANG_LOG_MS`` is true), ``force=True``, and the ``httpx``/``httpcore`` loggers at WARNING.
* ``sglang/srt/entrypoints/engine.py`` then logs, at INFO on its module logger
  ``sglang.srt.entrypoints.engine``, ``server_args={...}``: the repr of a dict of every resolved
  argument in which only the watermark secrets are replaced by ``'<redacted>'``.  The API key,
  the admin API key and the SSL key file password are in clear text.

The stand-in runs in one process, so its other start-up lines (the scheduler's ``TP0`` lines,
uvicorn's) are still written by ``server.log``/``server.raw`` as before.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
from typing import Any, Mapping, Optional

ENGINE_LOGGER = "sglang.srt.entrypoints.engine"
CONFIG_ENV = "SGLANG_LOGGING_CONFIG_PATH"
LOG_MS_ENV = "SGLANG_LOG_MS"
DATEFMT = "%Y-%m-%d %H:%M:%S"
# sglang/srt/sampling/watermarking/core.py WATERMARK_SECRET_FIELD_NAMES: a dict key among these
# is redacted whatever its value (None included).
WATERMARK_SECRET_FIELDS = frozenset({"watermark_key", "watermark_key_b", "watermark_config"})
REDACTED = "<redacted>"


def missing_config_message(path: str) -> str:
    return f"Setting {CONFIG_ENV} from env with {path} but it does not exist!"


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    """sglang.srt.environ.EnvBool: true/1/yes/y, false/0/no/n, anything else is an error."""
    value = env.get(name)
    if value is None:
        return False
    low = value.lower()
    if low in ("true", "1", "yes", "y"):
        return True
    if low in ("false", "0", "no", "n"):
        return False
    raise ValueError(f'"{low}" is not a valid boolean value')


def configure_logger(log_level: str, prefix: str = "", env: Optional[Mapping[str, str]] = None) -> None:
    """sglang's configure_logger for the stand-in's process (``log_level`` is ``--log-level``)."""
    env = os.environ if env is None else env
    path = env.get(CONFIG_ENV)
    if path:
        if not os.path.exists(path):
            raise Exception(missing_config_message(path))  # noqa: TRY002 - the real server raises exactly this
        with open(path, encoding="utf-8") as handle:
            config = json.loads(handle.read())
        logging.config.dictConfig(config)
        return
    maybe_ms = ".%(msecs)03d" if _env_bool(env, LOG_MS_ENV) else ""
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format=f"[%(asctime)s{maybe_ms}{prefix}] %(message)s",
        datefmt=DATEFMT,
        force=True,
    )
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def redact_watermark_secrets(value: Any) -> Any:
    """The real redaction, reduced to what a dict of command-line values can hold."""
    if isinstance(value, dict):
        return {k: (REDACTED if k in WATERMARK_SECRET_FIELDS else redact_watermark_secrets(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_watermark_secrets(v) for v in value]
    return value


def launch_command(argv, watermark_config=None) -> str:
    """ServerArgs.launch_command: the arguments as given, joined by spaces, with only the
    watermark config redacted (redact_watermark_command_line): ``--api-key KEY`` stays in clear."""
    out, redact_next = [], False
    for argument in argv:
        if redact_next:
            out.append(REDACTED)
            redact_next = False
        elif watermark_config is not None and argument == watermark_config:
            out.append(REDACTED)
        elif watermark_config is not None and "=" in argument and argument.split("=", 1)[1] == watermark_config:
            out.append(f"{argument.split('=', 1)[0]}={REDACTED}")
        elif argument == "--watermark-config":
            out.append(argument)
            redact_next = True
        elif argument.startswith("--watermark-config="):
            out.append(f"--watermark-config={REDACTED}")
        else:
            out.append(argument)
    return " ".join(out)


def server_args_for_logging(args: argparse.Namespace) -> dict:
    """What engine.py's ``_server_args_for_logging`` returns: every argument, watermark secrets
    redacted, everything else (the API keys too) as it is."""
    return redact_watermark_secrets(dict(vars(args)))


def log_server_args(args: argparse.Namespace) -> None:
    """The engine's start-up line, on the engine's logger at INFO."""
    logging.getLogger(ENGINE_LOGGER).info(f"server_args={server_args_for_logging(args)}")
