"""The base of every model: what the interface promises is typed, what it adds later is kept.

The interface grows without a version change (choices.md, "Versioning"), so a model never rejects
a field it does not know (``extra="allow"``) and a status or reason it does not know stays as its
text (:data:`Tolerant`) instead of failing a whole page of results.
"""


import enum
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer
from pydantic_core import PydanticCustomError

from kiosk_agent.money import MoneyError, cents_to_decimal, dollars_to_cents

E = TypeVar("E", bound=enum.Enum)

# An enum field that keeps an unknown value as plain text. StrEnum members compare equal to their
# text, so ``status == "pending"`` reads the same for known and unknown values.
Tolerant = Annotated[E | str, Field(union_mode="left_to_right")]


def empty_list() -> list[Any]:
    """A list field's default (``Field(default_factory=empty_list)``), not the builtin ``list``:
    pydantic reads a factory's signature while it builds the model, and a builtin's is parsed
    from its text by the tokenizer, whose patterns are compiled on first use (some 5 ms of one
    core, ten times that on a Pi Zero, before the first charge check)."""
    return []


def is_known(value: enum.Enum | str) -> bool:
    """True when a :data:`Tolerant` value matched a member of its enum."""
    return isinstance(value, enum.Enum)


# Validation messages name the expected form, never the value: a wrong field may hold a card
# number or a token, and these messages travel into exceptions, logs and the command line.
def invalid(kind: str, expected: str) -> PydanticCustomError:
    """A validation error of type ``kind`` whose message is ``expected`` (no input echoed)."""
    return PydanticCustomError(kind, expected)


def _exact_decimal(value: Any) -> Any:
    # A JSON double (scheduled payments, reporting) becomes Decimal through its shortest text, so
    # 12.1 stays 12.1 and never 12.0999999999999996447286321199499070644378662109375.
    if isinstance(value, bool):
        raise invalid("decimal_amount", "expected an amount in dollars, not a boolean")
    if isinstance(value, float):
        value = repr(value)
    if isinstance(value, (str, int, Decimal)):
        try:
            amount = Decimal(value)
        except InvalidOperation:
            amount = Decimal("NaN")
        # beyond any money (1e308): its cents could not even be counted later
        if not amount.is_finite() or abs(amount) >= _MOST_DOLLARS:
            raise invalid("decimal_amount", "expected an amount in dollars such as 12.50")
        return amount
    return value


_MOST_DOLLARS = Decimal(10) ** 15


# Dollars as the interface sends them (a decimal string or a JSON number), held as Decimal.
Dollars = Annotated[Decimal, BeforeValidator(_exact_decimal)]


def _request_dollars(value: Any) -> Any:
    # What we send must be exact: refuse floats and sub-cent amounts instead of rounding them.
    if isinstance(value, float):
        raise invalid("exact_dollars", 'expected dollars as text or Decimal ("12.50"), not a float')
    try:
        return cents_to_decimal(dollars_to_cents(value))
    except MoneyError:
        raise invalid(
            "exact_dollars",
            'expected dollars as text or Decimal with at most two decimal places ("12.50")',
        ) from None


def _two_places(value: Decimal) -> str:
    return f"{value:.2f}"


# Dollars we send (billing plans, hosted pages): exact, two places, serialised as ``"12.50"``.
RequestDollars = Annotated[
    Decimal, BeforeValidator(_request_dollars), PlainSerializer(_two_places, return_type=str)
]


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
    # cache_strings="keys": the JSON parser's string cache (16,384 strings, the whole process)
    # kept every sale's values, each met once (interaction ids, socket tokens, trans ids): the
    # agent grew with its sales until the cache was full. Keys repeat; they are still cached.
    model_config = ConfigDict(
        extra="allow", populate_by_name=True, validate_assignment=True, hide_input_in_errors=True,
        defer_build=True, cache_strings="keys",
    )

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            secret = name in SECRET_FIELDS and value is not None
            yield name, HIDDEN if secret else hide_secrets(value)


class RequestBody(ServiceModel):
    """A body we send."""

    def to_wire(self) -> dict[str, Any]:
        """The JSON body: optional fields not set are left out."""
        return self.model_dump(mode="json", exclude_none=True)


class ErrorBody(ServiceModel):
    """The error body of 400/401/404/409/429 answers: both fields optional."""

    error: str | None = None
    error_description: str | None = None
