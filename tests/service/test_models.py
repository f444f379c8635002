"""Models: extra fields kept, unknown enum values kept as text, money exact, wire shapes."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from kiosk_agent.service.errors import InvalidResponseError
from kiosk_agent.service.models import (
    ApiKeySet,
    BillingPlan,
    BillingPlanRequest,
    BillingPlanStatus,
    ChargeRequest,
    ChargeResult,
    HostedPage,
    HostedPageLink,
    Interaction,
    InteractionKind,
    InteractionStatus,
    MerchantPayload,
    ReadCardResult,
    ScheduledPayment,
    ScheduledPaymentStatus,
    WebhookEnvelope,
    is_known,
)
from kiosk_agent.service.models.reporting import Page, Transaction
from kiosk_agent.service.models.reports import Chargeback
from kiosk_agent.service.parsing import parse_interaction, parse_json


def test_charge_result_reads_both_spellings_and_keeps_extras() -> None:
    short = ChargeResult.model_validate(
        {"result": "A", "trans_id": "1", "respcode": "00", "resptext": "Approval", "new": 1}
    )
    long = ChargeResult.model_validate({"result": "A", "trans_id": "1", "resp_code": "00"})
    assert short.resp_code == long.resp_code == "00"
    assert short.resp_text == "Approval"
    assert short.model_extra == {"new": 1}


def test_unknown_status_is_kept_as_text() -> None:
    record = Interaction.model_validate({"interaction_id": "i", "status": "paused_by_operator"})
    assert record.status == "paused_by_operator"
    assert not is_known(record.status)
    assert record.finished  # the service moved on from pending
    known = Interaction.model_validate({"interaction_id": "i", "status": "pending"})
    assert known.status is InteractionStatus.PENDING
    assert is_known(known.status)


def test_a_fault_names_each_failed_stage_or_else_the_status() -> None:
    failed = Interaction.model_validate(
        {"interaction_id": "i", "status": "failed", "stage_errors": [
            {"stage": "read", "code": "card_removed", "message": "removed early"},
            {"stage": "print", "code": "capability_unsupported"},
        ]}
    )  # fmt: skip
    assert failed.fault == "terminal fault (read: card_removed; print: capability_unsupported)"
    expired = Interaction.model_validate({"interaction_id": "i", "status": "expired"})
    assert expired.fault == "terminal fault (expired)"


def test_billing_plan_doubles_become_exact_decimals() -> None:
    plan = BillingPlan.model_validate(
        {
            "id": 1, "name": "n", "description": None, "mid": "m", "payment_account_uuid": "u",
            "status": "ACTIVE", "rrule_pattern": "x", "amount": "12.10",
            "scheduled_payments": [
                {
                    "id": 1, "payment_number": 1, "payment_date": "2026-12-01T00:00:00.000Z",
                    "amount_scheduled": 12.1, "amount_paid": 0.0, "amount_remaining": 12.1,
                    "payment_status": "ON_HOLD",
                }
            ],
        }
    )
    payment = plan.scheduled_payments[0]
    assert plan.amount == Decimal("12.10")
    assert payment.amount_scheduled == Decimal("12.1")  # not 12.0999999999999996447...
    assert payment.payment_status == "ON_HOLD"
    assert plan.status is BillingPlanStatus.ACTIVE
    assert ScheduledPaymentStatus.PENDING == "PENDING"


def test_dollar_amounts_we_send_are_exact_two_place_strings() -> None:
    request = BillingPlanRequest(
        name="n", description="d", mid="m", payment_account_uuid="u", amount="12.5",  # type: ignore[arg-type]
        rrule_pattern="x",
    )
    assert request.model_dump(mode="json")["amount"] == "12.50"
    with pytest.raises(ValueError, match="float"):
        HostedPage(name="p", amount=12.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two decimal places"):
        HostedPage(name="p", amount="12.505")  # type: ignore[arg-type]


def test_hosted_page_range_only_when_amount_unlocked() -> None:
    with pytest.raises(ValueError, match="lock_amount"):
        HostedPage(name="p", lock_amount=True, min_amount="1.00")  # type: ignore[arg-type]
    page = HostedPage(name="p", lock_amount=False, min_amount="1", max_amount="20")  # type: ignore[arg-type]
    assert page.to_wire() == {
        "name": "p", "lock_amount": False, "min_amount": "1.00", "max_amount": "20.00"
    }


def test_hpp_client_id_is_the_last_path_segment() -> None:
    link = HostedPageLink(url="https://pay.example.com/hpp/abc123?x=1")
    assert link.hpp_client_id == "abc123"


def test_repr_hides_tokens_and_keys_at_any_depth() -> None:
    interaction = Interaction.model_validate(
        {"interaction_id": "i", "status": "succeeded", "kind": "read_card",
         "result": {"token": "9412345678901111", "last_four": "1111"}}
    )  # fmt: skip
    assert "9412345678901111" not in repr(interaction)
    assert "1111" in repr(interaction)
    keys = ApiKeySet(
        api_key="key-secret", public_key="pub", refresh_token="refresh-secret",
        api_key_expires_at=1, refresh_token_expires_at=2,
    )  # fmt: skip
    assert "secret" not in repr(keys)
    assert "secret" not in str(keys)
    request = ChargeRequest(amount=100, account_token="9412345678901111")
    assert "9412345678901111" not in repr(request)
    assert request.account_token == "9412345678901111"  # hidden from repr only


# -- refused values are never echoed -------------------------------------------------------------

CARD = "4111111111111111"
TOKEN = "tok_9412345678901111"


@pytest.mark.parametrize(
    ("model", "data", "field"),
    [
        (Transaction, {"trans_id": "1", "amount": f"{CARD}x"}, "amount"),
        (Transaction, {"trans_id": "1", "amount": 1, "card_number": int(CARD)}, "card_number"),
        (Chargeback, {"chargeback_id": 7, "amount": 1, "card_number": [CARD]}, "card_number"),
        (Page[Transaction], {"items": [{"trans_id": "1", "amount": TOKEN}]}, "items.0.amount"),
        (ReadCardResult, {"token": {"value": TOKEN}}, "token"),
        (ScheduledPayment, {
            "id": 1, "payment_number": 1, "payment_date": "2026-12-01T00:00:00.000Z",
            "amount_scheduled": 1, "amount_paid": CARD, "amount_remaining": TOKEN,
            "payment_status": "PENDING",
        }, "amount_paid"),  # 16 digits of dollars: beyond any money
        (MerchantPayload, {"merchant_id": TOKEN, "merchant_status_id": 1}, "merchant_id"),
        (WebhookEnvelope, {"event_type": "x", "timestamp": CARD, "metadata": {}}, "timestamp"),
    ],
)  # fmt: skip
def test_a_refused_answer_names_the_field_but_never_echoes_the_value(
    model: type[BaseModel], data: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(data)
    text = f"{refused.value} {refused.value!r}"
    assert field.rsplit(".", 1)[-1] in text
    assert CARD not in text
    assert TOKEN not in text

    # The client's own parser: a typed error naming the whole path, value still unseen.
    with pytest.raises(InvalidResponseError) as parsed:
        parse_json(model, json.dumps(data).encode(), what="answer")
    assert parsed.value.field == field
    for shown in (str(parsed.value), repr(parsed.value), str(parsed.value.__context__)):
        assert CARD not in shown
        assert TOKEN not in shown


def test_refused_request_amounts_say_the_form_expected_not_the_value() -> None:
    with pytest.raises(ValidationError) as sub_cent:
        HostedPage(name="p", amount=f"{CARD}.001")  # type: ignore[arg-type]
    assert "at most two decimal places" in str(sub_cent.value)
    with pytest.raises(ValidationError) as floating:
        HostedPage(name="p", amount=float(CARD))  # type: ignore[arg-type]
    assert "not a float" in str(floating.value)
    with pytest.raises(ValidationError) as word:
        BillingPlanRequest(
            name="n", description="d", mid="m", payment_account_uuid="u", amount=TOKEN,  # type: ignore[arg-type]
            rrule_pattern="x",
        )
    for refused in (sub_cent, floating, word):
        assert CARD[:12] not in str(refused.value)
        assert TOKEN not in str(refused.value)


def test_a_reported_amount_must_be_a_finite_number() -> None:
    for bad in ("NaN", "Infinity", "lots", True):
        with pytest.raises(ValidationError, match="expected an amount in dollars"):
            Transaction.model_validate({"trans_id": "1", "amount": bad})
    assert Transaction.model_validate({"trans_id": "1", "amount": 0.1}).amount_cents == 10


def test_an_answers_values_are_not_kept_in_the_parsers_string_cache() -> None:
    """pydantic's JSON parser caches strings for the whole process (16,384 of them): every
    sale's interaction id, socket token and trans id, each met once, were kept there, and the
    agent grew with its sales until the cache was full. Two parses of one answer now give two
    strings (a cached one would be the same object); its keys are still cached."""
    from kiosk_agent.service.models.terminal import InteractionAccepted, WsToken

    body = b'{"interaction_id": "ix-cache-0001", "status": "pending"}'
    first, second = (InteractionAccepted.model_validate_json(body) for _ in range(2))
    assert first.interaction_id == second.interaction_id
    assert first.interaction_id is not second.interaction_id
    token = b'{"token": "tok-cache-0001", "expires_at": 60}'
    assert WsToken.model_validate_json(token).token is not WsToken.model_validate_json(token).token


def _record(**fields: Any) -> dict[str, Any]:
    base = {"interaction_id": "i-1", "kind": "read_card", "status": "succeeded",
            "result": {"token": "9412345678901111"}}  # fmt: skip
    return {**base, **fields}


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (_record(interaction_id="i-0"), "interaction_id"),  # another customer's read
        (_record(kind="charge_card"), "kind"),
        (_record(kind=None, result={"last_four": "1111"}), "result.token"),  # checked as asked
    ],
)
def test_an_interaction_record_is_held_to_the_one_asked_about(
    record: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidResponseError) as refused:
        parse_interaction(record, what="read", asked=("i-1", InteractionKind.READ_CARD))
    assert refused.value.field == field


def test_an_interaction_of_a_kind_the_client_does_not_know_is_no_contradiction() -> None:
    record = parse_interaction(
        _record(kind="read_card_v2"), what="read", asked=("i-1", InteractionKind.READ_CARD)
    )
    assert record.interaction_id == "i-1"


@pytest.fixture
def far_east_of_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The unit's local time 14 hours ahead of UTC (Kiribati), as a Pi's TZ may be."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("far_east_of_utc")
@pytest.mark.parametrize(
    "sent", ["2026-11-29T10:15:30.123", "2026-11-29T10:15:30.123Z", "2026-11-30T00:15:30.123+14:00"]
)
def test_a_transaction_date_sent_without_an_offset_is_utc_whatever_the_unit_s_zone(
    sent: str,
) -> None:
    row = Transaction.model_validate({"trans_id": "1", "amount": 3, "trans_date": sent})
    utc = dt.datetime(2026, 11, 29, 10, 15, 30, 123000, tzinfo=dt.UTC).timestamp()
    assert row.trans_at == utc  # read as local time it was 14 hours early
    assert Transaction.model_validate({"trans_id": "2", "amount": 3}).trans_at is None
