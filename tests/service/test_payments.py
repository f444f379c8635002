"""Payments against the simulator over real HTTP: charge, capture, void or refund, surcharge,
receipts; amounts are integer cents on the way in and out."""

from __future__ import annotations

from typing import Any

import pytest

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import BadRequestError, InvalidResponseError
from kiosk_agent.service.models import ChargeRequest, ChargeResult, ChargeResultCode
from kiosk_agent.service.parsing import answer_to

from ..helpers import PythonCalls

# A simulator card token: 9, the card's first digit (4: credit), ten digits, the last four.
CREDIT_TOKEN = "9412345678901111"
DEBIT_TOKEN = "9612345678904444"


def card_charge(amount: int, **fields: Any) -> ChargeRequest:
    return ChargeRequest(amount=amount, account_token=CREDIT_TOKEN, expiration="1230", **fields)


async def test_charge_is_approved_and_keeps_the_order_id(service: ServiceClient) -> None:
    result = await service.payments.charge(card_charge(1250, order_id="kiosk-1"))
    assert result.result == ChargeResultCode.APPROVED
    assert result.approved
    assert result.amount == 1250
    assert result.order_id == "kiosk-1"
    assert result.resp_code is not None  # sent as respcode, read under both spellings


async def test_charge_without_order_id_gets_one_made_on_the_device(service: ServiceClient) -> None:
    result = await service.payments.charge(card_charge(300))
    assert result.order_id is not None
    assert result.order_id.startswith("ka-")


async def test_declined_charge_is_an_answer_not_an_error(service: ServiceClient) -> None:
    result = await service.payments.charge(card_charge(1002))
    assert result.result == ChargeResultCode.DECLINED
    assert not result.approved


async def test_authorize_then_capture_less_then_void(service: ServiceClient) -> None:
    auth = await service.payments.charge(card_charge(500, capture=False))
    assert auth.approved
    captured = await service.payments.capture(auth.trans_id, amount=350)
    assert captured.amount == 350
    with pytest.raises(BadRequestError):  # capturing twice is refused
        await service.payments.capture(auth.trans_id)
    voided = await service.payments.void_or_refund(auth.trans_id)
    assert voided.voided
    assert voided.trans_id


async def test_settled_charge_is_refunded_partly(service: ServiceClient, sim: Any) -> None:
    charged = await service.payments.charge(card_charge(2000))
    session = service.transport.session
    async with session.post(f"{sim.base_url}/sim/settle") as resp:
        assert resp.status == 200
    refund = await service.payments.void_or_refund(charged.trans_id, amount=500)
    assert refund.refunded
    assert refund.amount == 500
    with pytest.raises(BadRequestError):
        await service.payments.void_or_refund(charged.trans_id, amount=999_999)


async def test_unknown_transaction_is_a_bad_request_with_the_error_code(
    service: ServiceClient,
) -> None:
    with pytest.raises(BadRequestError) as caught:
        await service.payments.void_or_refund("no-such-trans")
    assert caught.value.status == 400
    assert caught.value.error == "invalid_trans_id"


async def test_surcharge_for_credit_and_none_for_debit(service: ServiceClient) -> None:
    credit = await service.payments.surcharge(1000, account_token=CREDIT_TOKEN)
    assert credit.surcharge
    assert credit.surcharge_amount > 0
    debit = await service.payments.surcharge(1000, account_token=DEBIT_TOKEN)
    assert not debit.surcharge
    assert debit.surcharge_amount == 0


async def test_send_receipt(service: ServiceClient) -> None:
    charged = await service.payments.charge(card_charge(700))
    sent = await service.payments.send_receipt(charged.trans_id, "buyer@example.com")
    assert sent.sent


def test_stored_credential_charge_needs_cof_fields() -> None:
    with pytest.raises(ValueError, match="cof"):
        ChargeRequest(amount=100, payment_account_uuid="u-1")
    request = ChargeRequest(amount=100, payment_account_uuid="u-1", cof="M", cof_sched=True)
    assert request.to_wire()["cof_sched"] == "Y"


def test_amounts_must_be_integer_cents() -> None:
    with pytest.raises(ValueError, match="integer cents"):
        ChargeRequest(amount=12.5, account_token=CREDIT_TOKEN)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="integer cents"):
        ChargeRequest(amount="1250", account_token=CREDIT_TOKEN)  # type: ignore[arg-type]


def _answer(**fields: Any) -> ChargeResult:
    base = {"result": "A", "trans_id": "100200300", "order_id": "kiosk-1", "mid": "999000000001"}
    return ChargeResult.model_validate({**base, **fields})


_ASKED = {"order_id": "kiosk-1", "mid": "999000000001", "currency": "USD", "trans_id": "100200300"}


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ({"order_id": "kiosk-2"}, "order_id"),
        ({"mid": "999000000002"}, "mid"),
        ({"currency": "EUR"}, "currency"),
        ({"trans_id": "  "}, "trans_id"),  # an approval with no transaction to capture or void
    ],
)
def test_an_answer_to_another_request_is_refused_naming_the_field(
    answer: dict[str, Any], field: str
) -> None:
    fields = ("order_id", "mid", "currency")
    with pytest.raises(InvalidResponseError) as refused:
        answer_to(_ASKED, _answer(**answer), fields, "charge order kiosk-1")
    assert refused.value.field == field
    assert "charge order kiosk-1" in str(refused.value)


def test_an_answer_is_held_only_to_what_it_names() -> None:
    # no order id, currency or mid in the answer: nothing contradicts the request
    bare = ChargeResult.model_validate({"result": "A", "trans_id": "100200300"})
    assert answer_to(_ASKED, bare, ("order_id", "mid", "currency"), "charge") is bare
    # a field sent as null names nothing; a currency code in another case is the same code
    nulls = _answer(order_id=None, mid=None, currency="usd")
    assert answer_to(_ASKED, nulls, ("order_id", "mid", "currency"), "charge") is nulls
    # a decline carries no transaction to act on: no trans id is no contradiction
    declined = _answer(result="C", trans_id="")
    assert answer_to(_ASKED, declined, ("order_id",), "charge") is declined


def test_a_charge_cards_answer_is_checked_in_few_calls() -> None:
    # each field named was compared through _said() on both sides (six calls a sale), and the
    # approval read twice (a property: a call each); only a currency's case needs a call
    answer = _answer(currency="usd")
    with PythonCalls() as calls:
        assert answer_to(_ASKED, answer, ("order_id", "mid", "currency"), "charge") is answer
    assert calls.count("_said") == 2, calls  # the currency, on both sides
    assert calls.count("approved") == 1, calls


def test_a_capture_answered_for_another_transaction_is_refused() -> None:
    with pytest.raises(InvalidResponseError) as refused:
        answer_to(_ASKED, _answer(trans_id="999"), ("trans_id", "mid"), "capture 100200300")
    assert refused.value.field == "trans_id"


def test_an_approval_of_nothing_is_refused_and_no_amount_is_not() -> None:
    # 0 cents approved is no answer to a charge of 300 (read as "no amount", it vended 300);
    # an approval naming no amount, and a decline of 0, are taken as before
    with pytest.raises(InvalidResponseError) as refused:
        answer_to(_ASKED, _answer(amount=0), ("order_id",), "charge")
    assert refused.value.field == "amount"
    bare = ChargeResult.model_validate({"result": "A", "trans_id": "100200300"})
    assert answer_to(_ASKED, bare, ("order_id",), "charge") is bare
    declined = _answer(result="C", amount=0)
    assert answer_to(_ASKED, declined, ("order_id",), "charge") is declined
