"""The base of every model: what the interface promises is typed, what it adds later is kept.

The interface grows without a version change (choices.md, "Versioning"), so a model never rejects
a field it does not know (``extra="allow"``) and a status or reason it does not know stays as its
text (:data:`Tolerant`) instead of failing a whole page of results.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kiosk_agent.money import MoneyError, cents_to_decimal, dollars_to_cents

E = TypeVar("E", bound=enum.Enum)

# An enum field that keeps an unknown value as plain text. StrEnum members compare equal to their
# text, so ``status == "pending"`` reads the same for known and unknown values.
Tolerant = Annotated[E | str, Field(union_mode="left_to_right")]


def is_known(value: enum.Enum | str) -> bool:
    """True when a :data:`Tolerant` value matched a member of its enum."""
    return isinstance(value, enum.Enum)


def _exact_decimal(value: Any) -> Any:
    # A JSON double (scheduled payments, reporting) becomes Decimal through its shortest text, so
    # 12.1 stays 12.1 and never 12.0999999999999996447286321199499070644378662109375.
    if isinstance(value, bool):
        raise ValueError("expected an amount, got a boolean")
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, str):
        try:
            return Decimal(value)
        except InvalidOperation:
            raise ValueError(f"not a decimal amount: {value!r}") from None
    return value


# Dollars as the interface sends them (a decimal string or a JSON number), held as Decimal.
Dollars = Annotated[Decimal, BeforeValidator(_exact_decimal)]


def _request_dollars(value: Any) -> Any:
    # What we send must be exact: refuse floats and sub-cent amounts instead of rounding them.
    if isinstance(value, float):
        raise ValueError(f"amount must be a decimal string or Decimal, not the float {value!r}")
    try:
        return cents_to_decimal(dollars_to_cents(value))
    except MoneyError as exc:
        raise ValueError(str(exc)) from None


# Dollars we send (billing plans, hosted pages): exact, two places, serialised as ``"12.50"``.
RequestDollars = Annotated[Decimal, BeforeValidator(_request_dollars)]


def _yes_no(value: Any) -> Any:
    if isinstance(value, str) and value.upper() in ("Y", "N"):
        return value.upper() == "Y"
    return value


# A flag the interface spells "Y"/"N"; read as bool (booleans also accepted).
YesNo = Annotated[bool, BeforeValidator(_yes_no)]


# Fields whose values stand in for a card or grant access: repr() shows them as hidden, at any
# depth (an interaction's ``result.token`` too), so a debugger or an f-string cannot leak them.
SECRET_FIELDS = frozenset(
    {"token", "account_token", "api_key", "refresh_token", "access_token", "cvn", "public_key"}
)
HIDDEN = "<hidden>"


def hide_secrets(value: Any) -> Any:
    """``value`` with every secret field of nested dicts and lists replaced by ``<hidden>``."""
    if isinstance(value, dict):
        return {
            k: HIDDEN if k in SECRET_FIELDS and v is not None else hide_secrets(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [hide_secrets(item) for item in value]
    return value


class ServiceModel(BaseModel):
    """Base model: extra fields kept, names as on the wire, assignment validated, secrets
    hidden from repr."""

    # hide_input_in_errors: a validation message must never echo a token or card data.
    model_config = ConfigDict(
        extra="allow", populate_by_name=True, validate_assignment=True, hide_input_in_errors=True
    )

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            secret = name in SECRET_FIELDS and value is not None
            yield name, HIDDEN if secret else hide_secrets(value)


class ErrorBody(ServiceModel):
    """The error body of 400/401/404/409/429 answers: both fields optional."""

    error: str | None = None
    error_description: str | None = None
