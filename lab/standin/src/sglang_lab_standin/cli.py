"""Command line of the stand-in: the real sglang 0.5.23 launch_server parser, rebuilt from data.

The flag list is ``sglang-0.5.23-cli.json`` (package data; see README.md next to it for its
provenance: it was dumped from the argparse parser of the real sglang 0.5.23 wheel).  The JSON
has no types, so values are converted like this:

* dests the stand-in itself uses have an explicit type (``KNOWN_TYPES``);
* integer choices (e.g. ``--log-requests-level``) convert to int so the choices match;
* otherwise the type is inferred from the default: an int default gets a lenient number
  converter (int, or float when the text is not an integer), a float default gets float;
* everything else stays a string.

``build_parser()`` and ``parse_args(argv)`` are the public API; other tests reuse them to
validate rendered command lines.  Errors behave like argparse in the real server: exit 2 with
``ambiguous option``, ``unrecognized arguments`` or ``invalid choice``.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from importlib import resources
from typing import Any, Iterable, Sequence

CLI_JSON_NAME = "sglang-0.5.23-cli.json"
PROG = "launch_server.py"

# Flags whose value the stand-in reads; types as in the real ServerArgs annotations.
KNOWN_TYPES: dict[str, Any] = {
    "port": int,
    "tp_size": int,
    "dp_size": int,
    "base_gpu_id": int,
    "mem_fraction_static": float,
    "max_running_requests": int,
    "max_queued_requests": int,
    "context_length": int,
    "cuda_graph_max_bs_decode": int,
    "cuda_graph_max_bs_prefill": int,
    "cuda_graph_bs_decode": int,
    "cuda_graph_bs_prefill": int,
    "speculative_num_steps": int,
    "speculative_eagle_topk": int,
    "speculative_num_draft_tokens": int,
    "speculative_dflash_block_size": int,
    "page_size": int,
    "watchdog_timeout": float,
}

# Extra flag understood only when the installed sglang source is a fork that has it
# (DDTree riding on DFLASH, "the second style"; see physics.SourceState.ddtree_flag_known).
DDTREE_FORK_FLAG = "--speculative-dflash-enable-ddtree"
# Extra flag understood only when the installed sglang source defines the field
# speculative_ddtree_budget (patch 0004 of the fleet's series; physics.SourceState
# .ddtree_budget_known): Optional[int] = None, so argparse takes an int and defaults to None.
DDTREE_BUDGET_FLAG = "--speculative-ddtree-budget"
# How each extra flag is added to the parser, as sglang would derive it from the field.
EXTRA_FLAGS: dict[str, dict[str, Any]] = {
    DDTREE_FORK_FLAG: {"action": "store_true", "default": False},
    DDTREE_BUDGET_FLAG: {"type": int, "default": None},
}



def load_actions() -> dict:
    """The parsed JSON document ({"sglang_version", "source", "actions": [...]})."""
    text = resources.files(__package__).joinpath(CLI_JSON_NAME).read_text(encoding="utf-8")
    return json.loads(text)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return float(text)


_number.__name__ = "int"


def _type_for(action: dict, default: Any):
    dest = action["dest"]
    if dest in KNOWN_TYPES:
        return KNOWN_TYPES[dest]
    choices = action.get("choices")
    if choices and all(isinstance(c, int) and not isinstance(c, bool) for c in choices):
        return int
    if isinstance(default, bool) or default is None:
        return None
    if isinstance(default, int):
        return _number
    if isinstance(default, float):
        return float
    return None


def _warn_deprecated(option_string: str) -> None:
    print(f"'{option_string}' is deprecated and will be removed in a future release.",
          file=sys.stderr, flush=True)


class DeprecatedStoreTrueAction(argparse.Action):
    """Stores True and warns, like sglang's action of the same name."""

    def __init__(self, option_strings, dest, nargs=0, const=True, default=False, **kw):
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        _warn_deprecated(option_string)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """Old valued flag whose single accepted value became a boolean (``--monokernel-backend amd``)."""

    def __init__(self, option_strings, dest, const_value=True, **kw):
        self.const_value = const_value
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        _warn_deprecated(option_string)
        setattr(namespace, self.dest, self.const_value)


class LoRAPathAction(argparse.Action):
    """``--lora-paths``: a list of paths or JSON objects with lora_name/lora_path."""

    def __call__(self, parser, namespace, values, option_string=None):
        out = []
        for item in values or []:
            item = item.strip()
            if item.startswith("{") and item.endswith("}"):
                try:
                    obj = json.loads(item)
                except ValueError as exc:
                    parser.error(f"argument {option_string}: invalid JSON {item!r}: {exc}")
                if not isinstance(obj, dict) or "lora_path" not in obj or "lora_name" not in obj:
                    parser.error(f"argument {option_string}: {item!r} needs 'lora_name' and 'lora_path'")
                out.append(obj)
            else:
                out.append(item)
        setattr(namespace, self.dest, out)


def _add_action(parser: argparse.ArgumentParser, action: dict) -> None:
    kind = action["kind"]
    flags = list(action["flags"])
    dest = action["dest"]
    default = _literal(action["default"])
    choices = action.get("choices")
    nargs = action.get("nargs")
    if kind == "_HelpAction":
        return  # add_help=True already created -h/--help
    if kind == "_StoreTrueAction":
        parser.add_argument(*flags, dest=dest, action="store_true", default=default)
    elif kind == "BooleanOptionalAction":
        positive = [f for f in flags if not f.startswith("--no-")]
        parser.add_argument(*positive, dest=dest, action=argparse.BooleanOptionalAction,
                            default=default)
    elif kind == "DeprecatedStoreTrueAction":
        parser.add_argument(*flags, dest=dest, action=DeprecatedStoreTrueAction, default=default)
    elif kind == "DeprecatedStoreConstAction":
        parser.add_argument(*flags, dest=dest, action=DeprecatedStoreConstAction,
                            default=default, choices=choices, nargs=nargs)
    elif kind == "LoRAPathAction":
        parser.add_argument(*flags, dest=dest, action=LoRAPathAction, default=default,
                            nargs=nargs)
    elif kind == "_StoreAction":
        kwargs: dict[str, Any] = {"dest": dest, "default": default}
        typ = _type_for(action, default)
        if typ is not None:
            kwargs["type"] = typ
        if choices is not None:
            kwargs["choices"] = choices
        if nargs is not None:
            kwargs["nargs"] = nargs
        parser.add_argument(*flags, **kwargs)
    else:  # pragma: no cover - the JSON has no other kinds
        raise ValueError(f"unsupported action kind {kind!r} for {flags}")


def build_parser(extra_flags: Iterable[str] = ()) -> argparse.ArgumentParser:
    """An argparse parser with every action of the real 0.5.23 launch_server parser.

    ``extra_flags`` may contain ``DDTREE_FORK_FLAG`` (store_true) when the installed sglang
    source is a fork that defines it, and ``DDTREE_BUDGET_FLAG`` (an int) when it defines
    ``speculative_ddtree_budget``.  Without them both are unrecognized arguments (exit 2).
    """
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=True, add_help=True)
    for action in load_actions()["actions"]:
        _add_action(parser, action)
    for flag in extra_flags:
        if flag not in EXTRA_FLAGS:
            raise ValueError(f"unknown extra flag {flag}")
        parser.add_argument(flag, dest=flag.lstrip("-").replace("-", "_"), **EXTRA_FLAGS[flag])
    return parser


def source_flags(source: Any) -> tuple:
    """The flags a patched source adds to the parser (a physics.SourceState's markers)."""
    return ((DDTREE_FORK_FLAG,) if source.ddtree_flag_known else ()) \
        + ((DDTREE_BUDGET_FLAG,) if source.ddtree_budget_known else ())


def parse_args(argv: Sequence[str], extra_flags: Iterable[str] = ()) -> argparse.Namespace:
    """Parse a launch_server argument list; SystemExit(2) on anything the real parser rejects.

    ``--config FILE`` is merged first, as 0.5.23's prepare_server_args does (ConfigArgumentMerger).
    """
    parser = build_parser(extra_flags)
    return parser.parse_args(merge_config(list(argv), parser))


def _yaml_scalar(text: str, path: str, lineno: int) -> Any:
    """One scalar of the flat YAML subset the stand-in reads (docs/lab-physics.md)."""
    text = text.strip()
    if text[:1] == '"':
        try:
            return json.loads(text)  # a JSON string is a YAML double-quoted scalar
        except ValueError as exc:
            raise ValueError(f"Config file {path} line {lineno}: bad quoted string ({exc})") from None
    if text[:1] == "'" and text.endswith("'") and len(text) > 1:
        return text[1:-1].replace("''", "'")
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("", "null", "~"):
        return None
    try:
        return _number(text)
    except ValueError:
        return text


def read_config_file(path: str) -> dict:
    """The mapping of a ``--config`` file: the real checks (YAML suffix, exists, a mapping at the
    root), for the flat ``key: scalar`` YAML the fleet writes (no PyYAML on the lab hosts)."""
    if not path.lower().endswith((".yaml", ".yml")):
        suffix = path.rsplit("/", 1)[-1].rpartition(".")[2]
        raise ValueError(f"Config file must be YAML format, got: .{suffix}" if "." in path.rsplit("/", 1)[-1]
                         else "Config file must be YAML format, got: ")
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        raise ValueError(f"Config file not found: {path}") from None
    out: dict = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#") or line.strip() == "---":
            continue
        key, sep, value = line.partition(":")
        if not sep or line[:1].isspace() or not key.strip():
            raise ValueError(f"Config file must contain a dictionary at root level ({path} line {lineno})")
        out[key.strip()] = _yaml_scalar(value, path, lineno)
    return out


def merge_config(argv: list, parser: argparse.ArgumentParser) -> list:
    """argv with a ``--config`` file's options put before the command line (CLI > config > defaults):
    True adds a store_true flag, False leaves it out, other booleans become ``--key true|false``."""
    where = [i for i, a in enumerate(argv) if a == "--config"]
    if not where:
        return argv
    if len(where) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    i = where[0]
    if i == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    store_true = {o[2:].replace("-", "_") for a in parser._actions
                  if isinstance(a, argparse._StoreTrueAction) for o in a.option_strings if o.startswith("--")}
    store_true |= {a.dest for a in parser._actions if isinstance(a, argparse._StoreTrueAction)}
    extra = []
    for key, value in read_config_file(argv[i + 1]).items():
        if isinstance(value, bool):
            if key.replace("-", "_") in store_true:
                extra += [f"--{key}"] if value else []
            else:
                extra += [f"--{key}", str(value).lower()]
        elif value is not None:
            extra += [f"--{key}", str(value)]
        else:
            extra += [f"--{key}", "None"]
    return extra + argv[:i] + argv[i + 2:]
