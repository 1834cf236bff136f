"""Every bool, int and float input is read through its conversion, wherever it is read.

`-e name=value` gives Ansible a string. role validate_inputs accepts `-e sglang_enable_metrics=false`
(a boolean string is a valid boolean), but a Jinja expression that reads the variable bare sees the
string "false", which is truthy: measured on ct200, that command promoted a metrics-on unit. So in
every Jinja expression of the roles and playbooks, an option whose argument spec type is bool, int
or float must be followed by ``| bool``, ``| int`` or ``| float`` (after an optional
``| default(...)``), unless the expression only renders it as text (``{{ name }}`` alone, or
joined with ``~``) or hands it whole to a module option (``option: "{{ name }}"``), whose own
argument spec converts it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CONVERSION = {"bool": "bool", "int": "int", "float": "float"}
JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
STRINGS = re.compile(r"'[^']*'|\"[^\"]*\"")


def typed_options() -> dict[str, str]:
    out = {}
    for path in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        for entry in (yaml.safe_load(path.read_text())["argument_specs"] or {}).values():
            for name, spec in (entry.get("options") or {}).items():
                if (spec or {}).get("type") in CONVERSION:
                    out[name] = spec["type"]
    return out


def scanned_files() -> list[Path]:
    roles = REPO / "roles"
    files = [*roles.glob("*/tasks/**/*.yml"), *roles.glob("*/handlers/*.yml"), *roles.glob("*/vars/*.yml"),
             *roles.glob("*/templates/*.j2"), *(REPO / "playbooks").glob("**/*.yml")]
    return sorted(files)


def bare_reads(text: str, options: dict[str, str]) -> list[str]:
    """'name (type): expression' for every read of a typed option without its conversion."""
    found = []
    for match in JINJA.finditer(text):
        expr = STRINGS.sub("''", match.group(0))
        line_start = text.rfind("\n", 0, match.start()) + 1
        line_end = text.find("\n", match.end())
        line = text[line_start:line_end if line_end >= 0 else len(text)]
        for name, kind in options.items():
            for use in re.finditer(r"(?<![\w.])%s\b(?!\s*[:=(])" % re.escape(name), expr):
                after, before = expr[use.end():], expr[:use.start()].rstrip()
                if re.match(r"\s*(\|\s*default\([^)]*\)\s*)?\|\s*(ansible\.builtin\.)?%s\b" % CONVERSION[kind], after):
                    continue
                if re.fullmatch(r"\{\{\s*%s\s*\}\}" % re.escape(name), expr):
                    continue  # rendered as text
                if before.endswith("~") or after.lstrip().startswith("~"):
                    continue  # joined into a message
                if re.match(r"^\s*[\w.]+: \"\{\{ %s \}\}\"\s*$" % re.escape(name), line):
                    continue  # a module option converts it
                found.append("%s (%s): %s" % (name, kind, " ".join(expr.split())[:160]))
    return found


def test_the_scan_finds_a_bare_read():
    """The check can fail: the bug as it was, and the fix."""
    options = {"sglang_enable_metrics": "bool", "sglang_port": "int"}
    assert bare_reads("x: \"{{ {'enable_metrics': sglang_enable_metrics} }}\"", options)
    assert bare_reads("{% if sglang_port > 1024 %}", options)
    assert not bare_reads("x: \"{{ {'enable_metrics': sglang_enable_metrics | bool} }}\"", options)
    assert not bare_reads("when: \"{{ sglang_enable_metrics | default(false) | bool }}\"", options)
    assert not bare_reads("port: \"{{ sglang_port }}\"\nmsg: \"{{ 'port ' ~ sglang_port }}\"", options)


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_typed_inputs_are_converted_where_read(path):
    options = typed_options()
    assert len(options) > 30  # the specs were read
    found = bare_reads(path.read_text(), options)
    assert not found, "%s reads typed inputs without converting them (-e gives strings):\n  %s" % (
        path.relative_to(REPO), "\n  ".join(found))
