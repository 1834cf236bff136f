# -*- coding: utf-8 -*-
"""Strict, fact-free checks of operator inputs against the roles' argument specs.

``ansible.builtin.validate_argument_spec`` (and a role's own argument validation) converts
silently: a ``str`` option takes a mapping and turns it into its repr, a ``list`` option splits
``"a,b"``, a ``dict`` option parses ``"k=v"``, an ``int`` option takes ``true``, a ``float``
option takes ``"nan"``. The role then renders that value into a unit or a command line, well
after the run has started changing hosts. ``input_problems`` refuses all of that and
also applies the ranges each option's argument spec states on the ``Limits:`` line of its
description (``spec_limits``: min/max, gt/lt, choices, pattern, absolute paths, allowed keys),
so role validate_inputs can fail every bad input in the preflight play, before any host
changes, with one message per variable that names it, its value and what is expected. The
argument spec is the one owner of an option's type, default, choices and range; ansible-doc
shows the Limits line to operators as it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleFilterError

BOOLEAN_STRINGS = {"yes", "no", "true", "false", "on", "off", "y", "n", "t", "f", "1", "0"}
INT_RE = re.compile(r"^\s*[-+]?[0-9]+\s*$")
FLOAT_RE = re.compile(r"^\s*[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?\s*$")
TYPE_WORDS = {
    "str": "a string",
    "path": "a path (a string)",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true or false)",
    "list": "a list",
    "dict": "a mapping",
}
PLURAL = {"str": "strings", "path": "paths", "int": "integers", "float": "numbers", "bool": "booleans",
          "list": "lists", "dict": "mappings"}


LIMITS_PREFIX = "Limits: "
LIMIT_KEYS = frozenset(("min", "max", "gt", "lt", "choices", "ignore_case", "nonempty", "absolute", "pattern",
                        "expect", "min_items", "allowed_keys", "key_pattern", "value_choices", "value_type",
                        "value_keys", "value_pattern", "value_expect"))


def _strict(pattern):
    """The pattern with each ``$`` outside a character class as ``\\Z``: Python's ``$`` also
    matches before a trailing newline, so ``^[a-z]+$`` would accept "root\\n" (one line more in
    an EnvironmentFile or a unit)."""
    out, in_class, escaped = [], False, False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif in_class:
            out.append(ch)
            in_class = ch != "]"
        elif ch == "[":
            out.append(ch)
            in_class = True
        else:
            out.append("\\Z" if ch == "$" else ch)
    return "".join(out)


def _matches(pattern, text):
    return re.search(_strict(pattern), text) is not None


def spec_limits(spec):
    """The ranges an argument-spec option states on its description's ``Limits: {...}`` line (a
    YAML flow mapping of LIMIT_KEYS), {} when it has none; fails on a line that is not one."""
    text = (spec or {}).get("description") or []
    found = {}
    for line in [text] if isinstance(text, str) else text:
        if not isinstance(line, str) or not line.startswith(LIMITS_PREFIX):
            continue
        try:
            limits = yaml.safe_load(line[len(LIMITS_PREFIX):])
        except yaml.YAMLError as exc:
            raise AnsibleFilterError("argument spec line %r is not a YAML mapping: %s" % (line, exc))
        unknown = sorted(set(limits) - LIMIT_KEYS) if isinstance(limits, Mapping) else None
        if unknown is None or unknown:
            raise AnsibleFilterError("argument spec line %r: expected a mapping of %s%s" % (
                line, ", ".join(sorted(LIMIT_KEYS)), "; unknown %s" % ", ".join(unknown) if unknown else ""))
        found.update(limits)
    return found


def _show(value, hidden=False):
    if hidden:
        return "<hidden>"
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# How a value is named in a message; bool before int (a bool is an int).
KINDS = ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"),
         (str, "string"), (Mapping, "mapping"), ((list, tuple), "list"))


def _kind(value):
    return next((word for types, word in KINDS if isinstance(value, types)), type(value).__name__)


def _as_number(value, wanted):
    """The value as int/float when it has the wanted type (numeric strings from -e k=v count)."""
    if isinstance(value, bool):
        return None
    if wanted == "int":
        if isinstance(value, int):
            return value
        if isinstance(value, str) and INT_RE.match(value):
            return int(value)
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and FLOAT_RE.match(value):
        number = float(value)
    else:
        return None
    return number if math.isfinite(number) else None


def _type_ok(value, wanted):
    """True when value has the wanted argument-spec type without a lossy conversion."""
    if wanted in ("int", "float"):
        return _as_number(value, wanted) is not None
    if wanted == "bool":
        return isinstance(value, bool) or (isinstance(value, str) and value.lower() in BOOLEAN_STRINGS) \
            or (isinstance(value, int) and value in (0, 1))
    if wanted == "str":
        return isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))
    if wanted == "path":
        return isinstance(value, str)
    if wanted == "list":
        return isinstance(value, (list, tuple))
    if wanted == "dict":
        return isinstance(value, Mapping)
    if wanted in ("raw", None):
        return True
    raise AnsibleFilterError("input_problems: argument spec type %r is not supported" % wanted)


def _range_problems(value, wanted, limits):
    """What the scalar value (already of the wanted type) breaks in limits, as 'expected ...' parts."""
    out = []
    if wanted in ("int", "float"):
        number = _as_number(value, wanted)
        if "min" in limits and number < limits["min"]:
            out.append("at least %s" % limits["min"])
        if "max" in limits and number > limits["max"]:
            out.append("at most %s" % limits["max"])
        if "gt" in limits and number <= limits["gt"]:
            out.append("greater than %s" % limits["gt"])
        if "lt" in limits and number >= limits["lt"]:
            out.append("less than %s" % limits["lt"])
    text = value if isinstance(value, str) else str(value)
    if "choices" in limits:
        choices = [str(c) for c in limits["choices"]]
        probe = text.upper() if limits.get("ignore_case") else text
        if probe not in [c.upper() if limits.get("ignore_case") else c for c in choices]:
            out.append("one of %s" % ", ".join(choices))
    if limits.get("nonempty") and not text.strip():
        out.append("not empty")
    if limits.get("absolute") and not text.startswith("/"):
        out.append("an absolute path")
    if "pattern" in limits and not _matches(limits["pattern"], text):
        out.append(limits.get("expect") or "matching %s" % limits["pattern"])
    return out


def _describe(spec, limits):
    """'an integer from 1 to 65535'-style description of what an option takes."""
    wanted = spec.get("type", "str")
    words = TYPE_WORDS.get(wanted, wanted)
    if wanted == "list" and spec.get("elements"):
        words = "a list of %s" % PLURAL.get(spec["elements"], spec["elements"])
    if spec.get("choices"):
        words += " (one of %s)" % ", ".join(str(c) for c in spec["choices"])
    if limits:
        parts = []
        for key, word in (("min", ">="), ("gt", ">"), ("max", "<="), ("lt", "<")):
            if key in limits:
                parts.append("%s %s" % (word, limits[key]))
        if "choices" in limits:
            parts.append("one of %s" % ", ".join(str(c) for c in limits["choices"]))
        if limits.get("absolute"):
            parts.append("absolute")
        if limits.get("nonempty"):
            parts.append("not empty")
        if "expect" in limits:
            parts.append(limits["expect"])
        elif "pattern" in limits or "key_pattern" in limits:
            parts.append("matching %s" % limits.get("pattern", limits.get("key_pattern")))
        if "min_items" in limits:
            parts.append("at least %s item(s)" % limits["min_items"])
        if "allowed_keys" in limits:
            parts.append("keys from %s" % ", ".join(limits["allowed_keys"]))
        if "value_choices" in limits:
            parts.append("values from %s" % ", ".join(limits["value_choices"]))
        if "value_keys" in limits:
            parts.append("each value a mapping of %s" % ", ".join(limits["value_keys"]))
        if parts:
            words += " (%s)" % "; ".join(parts)
    return words


def _check(name, value, spec, problems):
    """Append 'name=value: expected ...' for every way value breaks spec and its limits."""
    limits = spec_limits(spec)
    hidden = bool(spec.get("no_log"))
    wanted = spec.get("type", "str")
    expect = _describe(spec, limits)

    def bad(detail=None, hide=False):
        problems.append("%s=%s (%s): expected %s%s" % (
            name, _show(value, hidden or hide), _kind(value), expect, "; %s" % detail if detail else ""))

    if value is None or not _type_ok(value, wanted):
        bad()
        return
    if spec.get("choices") is not None and wanted not in ("list", "dict"):
        if str(value) not in [str(c) for c in spec["choices"]]:
            bad()
            return
    if wanted == "list":
        elements = spec.get("elements")
        if "min_items" in limits and len(value) < limits["min_items"]:
            bad("got %d item(s)" % len(value))
            return
        for i, item in enumerate(value):
            if elements and (item is None or not _type_ok(item, elements)):
                bad("item %d is %s %s" % (i, _kind(item), _show(item, hidden)))
                return
            if spec.get("choices") is not None and str(item) not in [str(c) for c in spec["choices"]]:
                bad("item %d is %s" % (i, _show(item, hidden)))
                return
            if elements not in ("list", "dict") and _range_problems(item, elements, limits):
                bad("item %d is %s" % (i, _show(item, hidden)))
                return
        return
    if wanted == "dict":
        if "allowed_keys" in limits:
            extra = sorted(str(k) for k in value if k not in limits["allowed_keys"])
            if extra:
                bad("unknown key(s) %s" % ", ".join(extra))
                return
        if "key_pattern" in limits:
            wrong = sorted(str(k) for k in value if not _matches(limits["key_pattern"], str(k)))
            if wrong:
                bad("key(s) %s" % ", ".join(wrong), hide=True)  # the values may be the secrets the names say
                return
        if "value_choices" in limits:
            wrong = sorted(str(k) for k, v in value.items() if str(v) not in limits["value_choices"])
            if wrong:
                bad("wrong value for %s" % ", ".join(wrong))
                return
        if "value_type" in limits:
            wrong = sorted(str(k) for k, v in value.items() if not _type_ok(v, limits["value_type"]))
            if wrong:
                bad("%s must be %s" % (", ".join(wrong), TYPE_WORDS[limits["value_type"]]))
                return
        if "value_pattern" in limits:
            wrong = sorted(str(k) for k, v in value.items() if not _matches(limits["value_pattern"], str(v)))
            if wrong:
                bad("value of %s must be %s" % (", ".join(wrong), limits.get("value_expect", "matching %s"
                                                                              % limits["value_pattern"])), hide=True)
                return
        if "value_keys" in limits:
            wrong = sorted("%s.%s" % (k, vk) for k, v in value.items() if isinstance(v, Mapping)
                           for vk in v if vk not in limits["value_keys"])
            if wrong:
                bad("unknown key(s) %s" % ", ".join(wrong))
                return
        sub = spec.get("options")
        if sub:
            unknown = sorted(str(k) for k in value if k not in sub)
            missing = sorted(k for k, s in sub.items() if s.get("required") and k not in value)
            if unknown or missing:
                bad("; ".join(filter(None, [
                    "unknown key(s) %s" % ", ".join(unknown) if unknown else "",
                    "missing key(s) %s" % ", ".join(missing) if missing else ""])))
                return
            for key, sub_spec in sub.items():
                if key in value:
                    _check("%s.%s" % (name, key), value[key], sub_spec, problems)
        return
    if _range_problems(value, wanted, limits):
        bad()


def input_problems(values, options):
    """One message per option in ``options`` (an argument spec entry point's options) whose value
    in ``values`` (option name -> value; absent when not set) breaks the spec or its Limits line."""
    if not isinstance(values, Mapping) or not isinstance(options, Mapping):
        raise AnsibleFilterError("input_problems expects a mapping of values and a mapping of options")
    problems = []
    for name in sorted(options):
        if name in values:
            _check(name, values[name], options[name] or {}, problems)
    return problems


def spec_options(specs, entry_points):
    """Merged options of ``entry_points`` (["role:entry", ...]) from ``specs`` (role -> the parsed
    meta/argument_specs.yml); fails naming an entry point that has no argument spec."""
    merged, where = {}, {}
    for ref in entry_points:
        role, _sep, entry = str(ref).partition(":")
        entry = entry or "main"
        try:
            options = specs[role]["argument_specs"][entry].get("options") or {}
        except (KeyError, TypeError, AttributeError):
            raise AnsibleFilterError("no argument spec for entry point %r of role %r" % (entry, role))
        for name, spec in options.items():
            if name in merged and merged[name] != spec:
                raise AnsibleFilterError("option %s is specified differently by %s and %s:%s; one definition is expected"
                                         % (name, where[name], role, entry))
            merged[name] = spec
            where.setdefault(name, "%s:%s" % (role, entry))
    return merged


# ---------------------------------------------------------------- unknown variables (typos)

# Variables with these prefixes belong to the project: the roles' (each role's options carry its
# name) and the playbooks' (ddtree_). A name with one of them that nothing defines is a typo.
PROJECT_PREFIX_EXTRA = ("ddtree",)
SET_FACT_ACTIONS = ("set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact")


def _yaml_file(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except (OSError, yaml.YAMLError):
        return None


def _names_set_by(node, out):
    """Names a task list (or play list) defines: register:, set_fact keys, vars: keys."""
    if isinstance(node, list):
        for item in node:
            _names_set_by(item, out)
        return
    if not isinstance(node, Mapping):
        return
    if isinstance(node.get("register"), str):
        out.add(node["register"])
    for action in SET_FACT_ACTIONS:
        if isinstance(node.get(action), Mapping):
            out.update(k for k in node[action] if k != "cacheable")
    if isinstance(node.get("vars"), Mapping):
        out.update(node["vars"])
    for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
        _names_set_by(node.get(key), out)


def known_inputs(collection_dir):
    """What the project reads, from the collection's roles/ and playbooks/ on the controller:
    ``options`` (every argument-spec option of every role entry point: what an operator sets),
    ``names`` (those, plus role defaults and vars and what tasks, handlers and playbooks set with
    register, set_fact or vars) and ``prefixes`` (the regex of project-owned names: each role's
    name or ddtree, followed by _)."""
    import glob
    import os

    root = str(collection_dir)
    options, names = set(), set()
    for path in glob.glob(os.path.join(root, "roles", "*", "meta", "argument_specs.yml")):
        specs = (_yaml_file(path) or {}).get("argument_specs") or {}
        for entry in specs.values():
            options.update((entry or {}).get("options") or {})
    for sub in ("defaults", "vars"):
        for path in glob.glob(os.path.join(root, "roles", "*", sub, "*.yml")):
            doc = _yaml_file(path)
            if isinstance(doc, Mapping):
                names.update(doc)
    for pattern in (("roles", "*", "tasks", "**", "*.yml"), ("roles", "*", "handlers", "*.yml"),
                    ("playbooks", "**", "*.yml")):
        for path in glob.glob(os.path.join(root, *pattern), recursive=True):
            _names_set_by(_yaml_file(path), names)
    roles = sorted(os.listdir(os.path.join(root, "roles")))
    words = sorted(set(roles) | set(PROJECT_PREFIX_EXTRA), key=len, reverse=True)
    return {"options": sorted(str(n) for n in options), "names": sorted(str(n) for n in names | options),
            "prefixes": "^(%s)_" % "|".join(re.escape(w) for w in words)}


def unknown_inputs(names, known, allowed=()):
    """'name: ...; did you mean X?' for each name in ``names`` (variables with a project prefix that
    this run defines) that ``known`` (known_inputs) does not have and ``allowed`` does not list; the
    suggestions are documented options only."""
    import difflib

    if not isinstance(known, Mapping) or "names" not in known:
        raise AnsibleFilterError("unknown_inputs expects the mapping known_inputs returns")
    have = set(known["names"]) | set(allowed or ())
    options = sorted(known.get("options") or [])
    out = []
    for name in sorted(set(names) - have):
        close = difflib.get_close_matches(name, options, n=3, cutoff=0.8)
        out.append("%s: no role or playbook of ddtree-fleet reads this variable (a typo?)%s" % (
            name, "; did you mean %s?" % " or ".join(close) if close else
            "; expected a documented option (ansible-doc -t role ddtree.fleet.<role>), or list it in ddtree_site_variables"))
    return out


class FilterModule:
    def filters(self):
        return {
            "input_problems": input_problems,
            "spec_options": spec_options,
            "spec_limits": spec_limits,
            "known_inputs": known_inputs,
            "unknown_inputs": unknown_inputs,
        }
