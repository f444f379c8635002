"""A configuration's mistakes, explained: each voluptuous error turned into a located
:class:`ConfigError` with a fix where one is obvious, and every mistake of a list's items found
(voluptuous stops at the first). Imported by ``load.validate`` when a section has a mistake: a
valid configuration, the one an agent runs on, never loads it (docs/architecture.md, "Idle
memory: tenth round")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import voluptuous as vol

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
