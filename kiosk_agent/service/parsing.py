"""From the service's bytes to models, with every bad answer turned into InvalidResponseError.

A wrong type, a missing field, an HTML page or a truncated body must reach the caller as one
typed error that names the field, never as a KeyError or AttributeError deep inside a flow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kiosk_agent.redact import redact
from kiosk_agent.service.errors import InvalidResponseError
from kiosk_agent.service.models.payments import ChargeResult
from kiosk_agent.service.models.terminal import (
    Interaction,
    InteractionKind,
    InteractionStatus,
    ReadCardResult,
)
from kiosk_agent.service.trans_ids import trans_key

M = TypeVar("M", bound=BaseModel)

BODY = "<body>"  # the field name of a body that is not JSON at all
_SNIPPET = 60


def decode_json(body: bytes, *, what: str, content_type: str = "") -> Any:
    """The JSON value of a response body, or InvalidResponseError naming ``<body>``."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        got = describe_body(body, content_type)
        raise InvalidResponseError(
            f"{what}: field {BODY!r}: expected JSON, got {got} ({exc})", field=BODY
        ) from None


def describe_body(body: bytes, content_type: str = "") -> str:
    """A short, safe description of a body for an error message (no long text echoed).

    A body that looks like JSON is described by size only: cut short, it may end inside a token
    or card number that no pattern would recognise. A proxy's page shows its start, redacted.
    """
    if not body:
        return "an empty body"
    kind = f"{len(body)} bytes of {content_type or 'text'}"
    if body.lstrip()[:1] in (b"{", b"[", b'"') or "json" in content_type:
        return kind
    head = redact(body[:_SNIPPET].decode("utf-8", "replace").strip().replace("\n", " "))
    if b"<html" in body[:512].lower() or "html" in content_type:
        kind = "an HTML page"
    return f"{kind} starting {head!r}"


def parse(model: type[M], data: Any, *, what: str, prefix: str = "") -> M:
    """Validate decoded JSON into ``model``; a bad answer names its field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_response(exc, data, what=what, prefix=prefix) from None


def answer_to(
    body: Mapping[str, Any], answer: ChargeResult, fields: Sequence[str], what: str
) -> ChargeResult:
    """``answer``, when it is the answer to ``body``: each of ``fields`` it names says what was
    asked, and an approval names its transaction. Else InvalidResponseError naming the field:
    the service answered 2xx, so it may have acted, but on what cannot be told (another order,
    merchant or currency, no transaction to capture or give back, an approval of 0 cents: every
    charge and capture asks for more, and a 0 read as no amount would vend the whole price).
    The caller treats it as a lost answer: looked up by what it asked, never taken for its own."""
    given = answer.model_fields_set
    for name in fields:
        got = getattr(answer, name) if name in given else None
        if got is None:
            continue
        asked = body.get(name)
        if name == "currency":  # a currency code in any case (usd is USD): _said's compare
            got, asked = _said(name, got), _said(name, asked)
        elif name == "trans_id":  # the sale's transaction, written otherwise: still it
            got, asked = trans_key(got), trans_key(asked)
        if got != asked:
            raise InvalidResponseError(
                f"{what}: field {name!r}: the answer names another {name} than asked",
                field=name,
            )
    approved = answer.approved
    if approved and not answer.trans_id.strip():
        raise InvalidResponseError(
            f"{what}: field 'trans_id': an approval without a transaction id", field="trans_id"
        )
    if approved and answer.amount == 0:  # None names no amount; 0 approves nothing
        raise InvalidResponseError(
            f"{what}: field 'amount': an approval of 0 cents for a charge of more", field="amount"
        )
    return answer


def _said(name: str, value: Any) -> Any:
    """A field's value as compared: a currency code in any case (``usd`` is USD)."""
    return value.upper() if name == "currency" and isinstance(value, str) else value


def charge_card_result(
    interaction: Interaction, order_id: str, *, mid: str | None = None, currency: str | None = None
) -> ChargeResult | None:
    """The result of a succeeded charge-card sent with ``order_id`` (None: no result), or
    InvalidResponseError when it cannot be read or names another charge (:func:`answer_to`):
    another order id, or, when given, another merchant than ``mid`` or currency than
    ``currency`` (the unit's; the terminal's request names neither, the charge is theirs)."""
    if interaction.result is None or interaction.status != InteractionStatus.SUCCEEDED:
        return None
    what = f"charge-card {interaction.interaction_id} result"
    result = _charge_of(interaction, what)
    asked = {"order_id": order_id, "mid": mid, "currency": currency}
    fields = [name for name, value in asked.items() if value is not None]
    return answer_to(asked, result, fields, what)


def _charge_of(interaction: Interaction, what: str) -> ChargeResult:
    """A succeeded charge-card's result as its model, or InvalidResponseError naming the field:
    validated once, the first time it is asked for, and kept with the record
    (``Interaction.charge_result``): ``parse_interaction``'s check, then the sale's reading."""
    try:
        result = interaction.charge_result
    except ValidationError as exc:
        raise invalid_response(exc, interaction.result, what=what, prefix="result") from None
    if result is None:  # a success without a result: refused as the model refuses None
        return parse(ChargeResult, interaction.result, what=what, prefix="result")
    return result


def parse_json(model: type[M], body: bytes, *, what: str) -> M:
    """Validate raw JSON bytes into ``model`` in one pass (the fast path for big pages)."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            decode_json(body, what=what)  # raises with a description of the body
        data = json.loads(body)
        raise invalid_response(exc, data, what=what) from None


def invalid_response(
    exc: ValidationError, data: Any, *, what: str, prefix: str = ""
) -> InvalidResponseError:
    """The first validation problem as an InvalidResponseError with a dotted field path."""
    first = exc.errors(include_input=False, include_url=False)[0]
    path = field_path(first["loc"], data, missing=first["type"] == "missing")
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    field = path or BODY
    got = _type_at(data, path[len(prefix) + 1 :] if prefix else path) if path else ""
    if not path:
        got = f", got {type(data).__name__}"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return InvalidResponseError(f"{what}: field {field!r}: {first['msg']}{got}{more}", field=field)


def field_path(loc: Sequence[int | str], data: Any, *, missing: bool = False) -> str:
    """The dotted path of a pydantic error location in the data, without union/model tags."""
    parts: list[str] = []
    node = data
    for index, item in enumerate(loc):
        in_dict = isinstance(node, dict) and item in node
        in_list = isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node)
        if in_dict or in_list:
            node = node[item]
        elif missing and index == len(loc) - 1 and isinstance(node, dict):
            node = None  # the field that is not there
        else:
            continue  # a union member or model name pydantic adds to the location
        parts.append(str(item))
    return ".".join(parts)


def _type_at(data: Any, path: str) -> str:
    node = data
    for part in path.split(".") if path else []:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return ""
    # the type only, never the value: it could be a token
    return f", got {type(node).__name__}" if path else ""


def sent_back(data: Any, key: str | None = None) -> bool:
    """Whether an answer that may be empty (DELETE, PUT) carries a record: a non-empty object,
    holding ``key`` when one is named."""
    if not isinstance(data, dict) or not data:
        return False
    return key is None or key in data


def _known(kind: InteractionKind | str | None, default: InteractionKind) -> Any:
    """A record's kind when the client knows it, else ``default`` (a newer service's kind is
    not a contradiction)."""
    return kind if isinstance(kind, InteractionKind) else default


def parse_interaction(
    data: Any, *, what: str, asked: tuple[str, InteractionKind] | None = None
) -> Interaction:
    """An interaction record, with a succeeded one's result checked against its kind's model.

    ``asked``: the interaction id and kind the caller asked about. A record of another id or
    kind is not its answer; one naming no kind has its result checked as the kind asked (a
    read or charge whose result is not one would reach the sale unchecked)."""
    interaction = parse(Interaction, data, what=what)
    kind = interaction.kind
    if asked is not None:
        asked_id, asked_kind = asked
        for name, got, want in (("interaction_id", interaction.interaction_id, asked_id),
                                ("kind", _known(kind, asked_kind), asked_kind)):
            if got != want:
                raise InvalidResponseError(
                    f"{what}: field {name!r}: the record names another {name} than asked",
                    field=name,
                )
        kind = asked_kind
    if interaction.status == InteractionStatus.SUCCEEDED:
        if kind == InteractionKind.READ_CARD:
            parse(ReadCardResult, interaction.result, what=what, prefix="result")
        elif kind == InteractionKind.CHARGE_CARD:
            _charge_of(interaction, what)  # kept with the record: the sale reads it after
    return interaction
