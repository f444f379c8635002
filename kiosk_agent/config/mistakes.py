"""A configuration's mistakes, explained: each voluptuous error turned into a located
:class:`ConfigError` with a fix where one is obvious, every mistake of a list's items found
(voluptuous stops at the first), and a YAML parse error in plain words (:func:`syntax_error`).
Imported by ``load.validate`` and the YAML loader when they meet a mistake: a valid
configuration, the one an agent runs on, never loads it (docs/architecture.md, "Idle memory:
tenth round")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import voluptuous as vol
import yaml

from kiosk_agent.config.load import (
    ConfigError,
    Position,
    SecretValue,
    _known_keys,
    _prefixed,
    _unwrap,
    _value_at,
    format_path,
    locate,
)
from kiosk_agent.config.yaml_loader import suggest


def explain(
    error: vol.Invalid,
    data: Any,
    prefix: list[Any],
    default: Position | None,
    schema: Any = None,
) -> ConfigError:
    """Turn one voluptuous error into a located :class:`ConfigError` with a fix when obvious."""
    full_path = prefix + list(error.path)
    where = locate(data, full_path, default)
    message = error.msg
    fix: str | None = None
    last = error.path[-1] if error.path else None
    if message.startswith("extra keys not allowed"):
        message = f"unknown key {last!r}"
        known = _known_keys(list(error.path), schema) if schema is not None else []
        close = suggest(str(last), known)
        if close:
            fix = f"did you mean {close!r}?"
        elif known:
            fix = f"known keys: {', '.join(sorted(known))}"
    elif message.startswith("required key not provided"):
        message = f"required key {last!r} is missing"
        fix = f"add `{last}: ...`"
    elif (
        "expected an amount like" in message
        and "got" in message
        and isinstance(_value_at(data, full_path), float)
    ):
        fix = 'write the price in quotes, like "2.50", or as integer cents'
    elif message.startswith("expected str"):
        message = f"expected text, got {_shown(_value_at(data, full_path))}"
    elif message.startswith("expected int"):
        message = f"expected a whole number, got {_shown(_value_at(data, full_path))}"
    elif message.startswith("expected bool"):
        message = f"expected true or false, got {_shown(_value_at(data, full_path))}"
        fix = f"write `{last}: true` or `{last}: false`"
    elif message.startswith("value must be one of"):
        message = f"{message}, got {_shown(_value_at(data, full_path))}"
    if len(message) > _MESSAGE_CHARS:  # a validator quoting a whole value
        message = message[: _MESSAGE_CHARS - 3] + "..."
    return ConfigError(
        where.file if where else "?",
        where.line if where else None,
        format_path(full_path),
        message,
        fix,
    )


_MESSAGE_CHARS = 300


def _shown(value: Any) -> str:
    """A value as an error may show it: a secret is never shown, long text is cut."""
    if isinstance(value, SecretValue):
        return "a value from !secret or !env_var (not shown)"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def every_invalid(schema: Any, value: Any, err: vol.Invalid) -> list[vol.Invalid]:
    """``err``'s mistakes plus those voluptuous skipped in the other items of a list.

    voluptuous stops a list at the first item with a mistake inside it (``buttons[0].price``),
    so the items after it were never looked at. Each list named in a mistake's path is walked
    here again, item by item, with the list's own item schema.
    """
    found = list(err.errors) if isinstance(err, vol.MultipleInvalid) else [err]
    lists: list[list[Any]] = []
    for error in found:
        path = list(error.path)
        for depth, step in enumerate(path):
            where = path[:depth]
            listed = isinstance(_value_at(value, where), list)
            if isinstance(step, int) and listed and where not in lists:
                lists.append(where)
    for where in lists:
        item_schema = _item_schema(schema, where)
        if item_schema is None:
            continue
        reported = {
            e.path[len(where)]
            for e in found
            if len(e.path) > len(where) and list(e.path[: len(where)]) == where
        }
        for index, item in enumerate(_value_at(value, where)):
            if index in reported:
                continue
            try:
                item_schema(item)
            except vol.Invalid as item_err:
                for e in every_invalid(item_schema, item, item_err):
                    found.append(_prefixed(e, [*where, index]))
    return found


def _item_schema(schema: Any, path: list[Any]) -> Callable[[Any], Any] | None:
    """The validator a schema applies to each item of the list at ``path``, when it has one."""
    node = _unwrap(schema)
    for step in path:
        if isinstance(node, dict):
            node = _unwrap(
                next(
                    (
                        v
                        for k, v in node.items()
                        if getattr(k, "schema", k) == step
                        or (isinstance(k, type) and isinstance(step, k))
                    ),
                    None,
                )
            )
        elif isinstance(node, list) and isinstance(step, int) and len(node) == 1:
            node = _unwrap(node[0])
        else:
            return None
    if not isinstance(node, list) or len(node) != 1:
        return None
    item = node[0]
    if isinstance(item, (dict, list)):
        return vol.Schema(item)
    return item if callable(item) else None


# -- YAML syntax errors -------------------------------------------------------------------------


# PyYAML's problem -> what it means to a person, and whether indentation is the usual cause.
_PROBLEMS: list[tuple[str, str, bool]] = [
    (
        "mapping values are not allowed here",
        "a `key:` where a value was expected",
        True,
    ),
    ("could not find expected ':'", "a line inside a mapping that is not `key: value`", True),
    ("did not find expected key", "this line does not line up with its mapping", True),
    ("did not find expected '-' indicator", "this line does not line up with its list", True),
    ("expected <block end>", "this line does not line up with the block above it", True),
    ("did not find expected node content", "a value is missing or misplaced", True),
    ("found character '\\t'", "a tab character", False),
    ("that cannot start any token", "a character that cannot start a value", False),
    ("found undefined alias", "an alias (*name) with no anchor (&name) before it", False),
    ("found duplicate anchor", "the same anchor (&name) is defined twice", False),
    ("found unknown escape character", "an unknown escape in a double-quoted string", False),
    ("expected ',' or '}'", "a { ... } mapping is not closed, or lacks a comma", False),
    ("expected ',' or ']'", "a [ ... ] list is not closed, or lacks a comma", False),
    ("found unexpected end of stream", "the file ends inside a quoted string", False),
    ("expected a single document", "more than one document (---) in one file", False),
    ("expected alphabetic or numeric character", "an anchor or alias name is missing", False),
    ("found unhashable key", "a list or mapping used as a key", False),
    ("could not determine a constructor", "an unknown tag (the `!name` before a value)", False),
]

# PyYAML's "while parsing a block collection" -> what a person calls it
_CONTEXTS = {
    "block collection": "block",
    "block mapping": "mapping",
    "block sequence": "list",
    "flow mapping": "{ ... } mapping",
    "flow sequence": "[ ... ] list",
    "quoted scalar": "quoted string",
    "simple key": "key",
    "anchor": "anchor",
    "alias": "alias",
    "tag": "tag",
}

_FIXES = {
    "found character '\\t'": "YAML indents with spaces only; replace the tab with spaces",
    "that cannot start any token": "put the value in quotes",
    "found unknown escape character": "use single quotes, or double the backslash",
    "found unexpected end of stream": "close the quote",
    "expected a single document": "keep one document per file",
    "expected alphabetic or numeric character": "quote a value that starts with * or &",
    "could not determine a constructor": "the tags are !secret, !env_var and !include",
    "an 'alias bomb'": "write the values out, or use fewer aliases of aliases",
    "nested more than": "flatten the structure",
}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _indentation_hint(text: str, line: int, column: int) -> str | None:
    """What probably went wrong at a structural error (0-based ``line``/``column``).

    Compares the line with the nearest non-blank line above it; never quotes either line.
    """
    lines = text.splitlines()
    if not 0 <= line < len(lines):
        return None
    here = lines[line]
    if "\t" in here[: _indent(here) + 1]:
        return f"line {line + 1} is indented with a tab; YAML indents with spaces only"
    if ": " in here[:column]:  # `key: value: more`
        return f"line {line + 1} holds a second ': '; put its value in quotes"
    for above in range(line - 1, -1, -1):
        stripped = lines[above].split(" #", 1)[0].strip()
        if not stripped or stripped.startswith("#"):
            continue
        a, b = _indent(lines[above]), _indent(here)
        if b > a and ":" not in stripped and not stripped.startswith("-"):
            return (
                f"line {above + 1} has no ':' after its key, so line {line + 1} cannot be "
                f"indented under it"
            )
        if a == b:
            return (
                f"lines {above + 1} and {line + 1} are both indented {a} spaces; check that "
                f"line {above + 1} ends its key with ':' and each value is on its key's line "
                f"or indented below it"
            )
        return (
            f"line {line + 1} is indented {b} spaces and line {above + 1} {a}; the keys of "
            f"one mapping (and the items of one list) start in the same column"
        )
    return None


def syntax_error(err: yaml.MarkedYAMLError, label: str, text: str) -> ConfigError:
    """A located, plain-words :class:`ConfigError` for a YAML parse error (no quoted content)."""
    mark = err.problem_mark or err.context_mark
    problem = err.problem or ""
    said = f"{err.context or ''} {problem}"
    explained, indentation = next(
        ((text_, indent) for key, text_, indent in _PROBLEMS if key in said),
        (problem or "cannot be parsed", False),
    )
    fix = next((f for key, f in _FIXES.items() if key in said), None)
    syntax = isinstance(err, (yaml.scanner.ScannerError, yaml.parser.ParserError))
    kind = "YAML syntax" if syntax else "YAML"
    if indentation and mark is not None:
        fix = _indentation_hint(text, mark.line, mark.column)
    context = err.context_mark
    if (
        context is not None
        and mark is not None
        and context.line != mark.line
        and err.context
        and err.context.startswith("while ")
    ):
        what = next((name for key, name in _CONTEXTS.items() if key in err.context), "block")
        explained += f" (in the {what} that starts on line {context.line + 1})"
    return ConfigError(
        label,
        mark.line + 1 if mark is not None else None,
        "",
        f"{kind}: {explained}",
        fix,
        mark.column + 1 if mark is not None else None,
    )
