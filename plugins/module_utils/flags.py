"""SGLang 0.5.23 command lines from ddtree-fleet's declared settings (pure logic, no Ansible).

One function, `sglang_argv(cfg)`, turns the operator's `sglang_*` settings (collected by the
sglang role into one dict) into the argument list of
`python -m sglang.launch_server`. Only current 0.5.23 spellings are emitted
(`--cuda-graph-backend-decode`, `--cuda-graph-max-bs-decode`, ...): every flag here parses with
the real 0.5.23 parser (tests/unit/flags/test_flags.py checks that against the real flag list),
except two that only a patched or forked source defines, each rendered only for DDTREE:
`--speculative-ddtree-budget` (patch 0004, or a fork) and `--speculative-dflash-enable-ddtree`
(`flag` style, a fork). The sglang role refuses either before a source that lacks it is used.

Also `config_fingerprint(text)`, the short identity of a rendered service configuration used for
quarantine records and the known-good record.
"""
from __future__ import annotations

import hashlib

ALGORITHMS = ("NEXTN", "EAGLE", "EAGLE3", "DFLASH", "DDTREE")
DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3", "DFLASH", "DDTREE")
DFLASH_FAMILY = ("DFLASH", "DDTREE")
CUDA_GRAPH_BACKENDS = ("full", "breakable", "disabled")
DDTREE_STYLES = ("algorithm", "flag")
# The flag that DDTree forks which keep `--speculative-algorithm DFLASH` use to switch tree
# verification on. It is not part of upstream 0.5.23: only valid with such a fork.
DDTREE_FORK_FLAG = "--speculative-dflash-enable-ddtree"
# The DDTree node budget (draft nodes per tree, root excluded; the verify width is budget + 1).
# Not part of stock 0.5.23: patch 0004 adds the field `speculative_ddtree_budget` to
# sglang/srt/arg_groups/fields/spec.py (sglang derives the flag from the field name). 0 (the
# role default) leaves it out of the command line, so the server's own default (32) applies.
DDTREE_BUDGET_FLAG = "--speculative-ddtree-budget"
DDTREE_BUDGET_FIELD = "speculative_ddtree_budget"
DDTREE_BUDGET_FILE = "sglang/srt/arg_groups/fields/spec.py"
DDTREE_MAX_BUDGET = 1023
API_KEY_ENV = "SGLANG_API_KEY"
# Where the unit's ExecStartPre writes the API key for SGLang's `--config <yaml>` (0600, the
# service user's RuntimeDirectory on tmpfs): the key never sits on a command line, where any
# local user reads it in /proc/PID/cmdline and ps. 0.5.23 reads a key from no environment variable.
API_KEY_CONFIG_DEFAULT = "/run/sglang/api-key.yaml"
# Flags sglang_extra_args may not pass: the role renders them from their own settings, or they
# carry secrets (a later --api-key would override the --config file's key: CLI > config file).
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--config")


class FlagError(ValueError):
    """A setting that cannot be turned into a valid SGLang command line."""


def _num(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FlagError(f"{name} must be a number, got {value!r}")
    return value


def _fmt(value) -> str:
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


def sglang_argv(cfg: dict) -> list[str]:
    """Arguments after `python -m <module>` for the declared configuration `cfg`.

    Keys: model_path, algorithm, draft_path, ddtree_style, host, port, tp_size,
    mem_fraction_static, cuda_graph_backend {decode, prefill}, cuda_graph_max_bs,
    attention_backend, draft_attention_backend, speculative {num_steps, eagle_topk,
    num_draft_tokens}, ddtree_budget (0: not passed), served_model_name, context_length,
    max_running_requests, enable_metrics, trust_remote_code, api_key_set, api_key_config
    (the `--config` file that holds the key, default API_KEY_CONFIG_DEFAULT), extra_args.
    """
    algo = str(cfg.get("algorithm", "")).upper()
    if algo not in ALGORITHMS:
        raise FlagError(f"speculative algorithm must be one of {', '.join(ALGORITHMS)}, got {cfg.get('algorithm')!r}")
    style = cfg.get("ddtree_style", "algorithm")
    if style not in DDTREE_STYLES:
        raise FlagError(f"ddtree_style must be one of {', '.join(DDTREE_STYLES)}, got {style!r}")
    if not cfg.get("model_path"):
        raise FlagError("model_path is required")
    argv = ["--model-path", str(cfg["model_path"])]
    if cfg.get("served_model_name"):
        argv += ["--served-model-name", str(cfg["served_model_name"])]
    argv += ["--host", str(cfg.get("host", "127.0.0.1")), "--port", str(int(cfg.get("port", 30000)))]
    argv += ["--tp-size", str(int(cfg.get("tp_size", 1)))]
    if cfg.get("mem_fraction_static") is not None:
        argv += ["--mem-fraction-static", _fmt(_num(cfg["mem_fraction_static"], "mem_fraction_static"))]
    if cfg.get("context_length"):
        argv += ["--context-length", str(int(cfg["context_length"]))]
    if cfg.get("max_running_requests"):
        argv += ["--max-running-requests", str(int(cfg["max_running_requests"]))]
    if cfg.get("attention_backend"):
        argv += ["--attention-backend", str(cfg["attention_backend"])]
    graphs = cfg.get("cuda_graph_backend") or {}
    for phase in ("decode", "prefill"):
        value = graphs.get(phase)
        if value is None:
            continue
        if value not in CUDA_GRAPH_BACKENDS:
            raise FlagError(f"cuda_graph_backend.{phase} must be one of {', '.join(CUDA_GRAPH_BACKENDS)}, got {value!r}")
        argv += [f"--cuda-graph-backend-{phase}", value]
    if cfg.get("cuda_graph_max_bs") and graphs.get("decode", "full") != "disabled":
        argv += ["--cuda-graph-max-bs-decode", str(int(cfg["cuda_graph_max_bs"]))]

    emitted = "DFLASH" if (algo == "DDTREE" and style == "flag") else algo
    argv += ["--speculative-algorithm", emitted]
    if algo in DRAFT_ALGORITHMS:
        if not cfg.get("draft_path"):
            raise FlagError(f"{algo} needs a draft model (draft_path)")
        argv += ["--speculative-draft-model-path", str(cfg["draft_path"])]
        if cfg.get("draft_attention_backend"):
            argv += ["--speculative-draft-attention-backend", str(cfg["draft_attention_backend"])]
    spec = cfg.get("speculative") or {}
    if algo in DFLASH_FAMILY:
        # DFLASH forces num_steps=1 / topk=1 and reads the block size from the draft config;
        # only an explicit block size is passed on.
        if spec.get("num_draft_tokens"):
            argv += ["--speculative-num-draft-tokens", str(int(spec["num_draft_tokens"]))]
    else:
        for key, flag in (("num_steps", "--speculative-num-steps"), ("eagle_topk", "--speculative-eagle-topk"),
                          ("num_draft_tokens", "--speculative-num-draft-tokens")):
            if spec.get(key):
                argv += [flag, str(int(spec[key]))]
    if algo == "DDTREE" and style == "flag":
        argv.append(DDTREE_FORK_FLAG)
    budget = ddtree_budget(cfg.get("ddtree_budget"))
    if algo == "DDTREE" and budget:
        # Both styles: the declared algorithm is DDTREE; with `flag` the fork must define the
        # same flag (the sglang role checks its installed source). Other algorithms never get it.
        argv += [DDTREE_BUDGET_FLAG, str(budget)]
    if cfg.get("enable_metrics"):
        argv.append("--enable-metrics")
    if cfg.get("trust_remote_code"):
        argv.append("--trust-remote-code")
    extra = [str(a) for a in cfg.get("extra_args") or []]
    _refuse_owned_flags(extra, argv)
    argv += extra
    if cfg.get("api_key_config") or cfg.get("api_key_set"):
        # The unit writes the keys (the admin key always, a random one when none is declared; the
        # client key when set) from its 0600 EnvironmentFile into this file before each start
        # (sglang_service's ExecStartPre): neither the unit nor the command line holds them.
        argv += ["--config", str(cfg.get("api_key_config") or API_KEY_CONFIG_DEFAULT)]
    return argv


def _refuse_owned_flags(extra: list[str], rendered: list[str]) -> None:
    """sglang_extra_args must not repeat a flag the role renders (the last one wins in argparse,
    silently replacing the declared --host, --port, ...) nor pass a secret flag. argparse also
    takes any unambiguous prefix (allow_abbrev), so `--api-k` counts as `--api-key`."""
    owned = sorted({a for a in rendered if a.startswith("--")} | set(SECRET_FLAGS))
    for arg in extra:
        if not arg.startswith("--") or arg == "--":
            continue
        name = arg.split("=", 1)[0]
        hit = next((f for f in owned if f == name or (len(name) > 3 and f.startswith(name))), None)
        if hit:
            why = ("it carries a secret: set sglang_api_key" if hit in SECRET_FLAGS
                   else "the role renders it from its own setting")
            raise FlagError(f"sglang_extra_args must not pass {name} ({hit}): {why}")


def ddtree_budget(value) -> int:
    """The node budget as an int: 0 (or unset) means "not passed", else 1..DDTREE_MAX_BUDGET."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise FlagError(f"ddtree_budget must be an integer, got {value!r}")
    budget = int(value)
    if not 0 <= budget <= DDTREE_MAX_BUDGET:
        raise FlagError(f"ddtree_budget must be 0 (not passed) or from 1 to {DDTREE_MAX_BUDGET}, got {budget}")
    return budget


def systemd_quote(arg: str) -> str:
    """Quote one argument for an ExecStart= line (keeps ${VAR} expansion working)."""
    if arg and all(c.isalnum() or c in "-_./:=,@+${}" for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(argv: list[str]) -> str:
    return " ".join(systemd_quote(a) for a in argv)


def config_fingerprint(*parts: str) -> str:
    """Short, stable identity of a service configuration (unit text, env keys, ...)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]
