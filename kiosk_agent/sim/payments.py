"""The payments interface: charge, capture, void-or-refund, surcharge, receipts, key refresh.

Every approved, retried or declined charge becomes a ledger row, so reporting sees it. A charge
is idempotent per ``(mid, order_id)`` the way a real gateway's duplicate check is: a second
charge with the order_id of an approved one answers the first result (same ``trans_id``) and
moves no money. Declines and retries are not remembered, so a retry really is tried again.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from kiosk_agent.service.models.reporting import TransStatus
from kiosk_agent.sim import cards
from kiosk_agent.sim.auth import Credential, bearer_token
from kiosk_agent.sim.cards import Outcome
from kiosk_agent.sim.context import SimContext, sim_context
from kiosk_agent.sim.http import (
    ApiError,
    Body,
    bad_request,
    json_response,
    read_json,
)
from kiosk_agent.sim.ledger import CUSTOM_FIELDS, new_order_id

RESP_PROC = "SIM"
_EXPIRATION = re.compile(r"^(0[1-9]|1[0-2])\d{2}$")
_CURRENCY = re.compile(r"^[A-Z]{3}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# outcome -> (result, respcode, resptext); the terminal-only outcomes approve here
_RESPONSES = {
    Outcome.APPROVED: ("A", "00", "Approval"),
    Outcome.RETRY: ("B", "91", "Issuer unavailable, retry"),
    Outcome.DECLINED: ("C", "05", "Do not honor"),
}
_ACH_FIELDS = ("payment_description", "ach_discretionary_data", "entry_class", "credit_or_debit")
_TEXT_FIELDS = (
    "name", "address1", "address2", "city", "region", "country", "account_zip", "phone",
    "email", "user_identifier", "vault_holder_id", "terminal_id", "cvn", "order_date",
    "comm_card", "ship_to_name", "ship_to_address1", "ship_to_city", "ship_to_region",
    "ship_to_zip", "ship_to_country", "ship_from_zip", "po_number", "tax_amount",
    "shipping_amount", "duty_amount", "discount_amount", *_ACH_FIELDS, *CUSTOM_FIELDS,
)  # fmt: skip


class Payments:
    def __init__(self, ctx: SimContext) -> None:
        self._ctx = ctx
        self._ledger = ctx.ledger
        # The full charge answer of each approved charge, for order_id idempotency.
        self._answers = ctx.store.documents("charge_answers")

    # -- charge ----------------------------------------------------------------------------
    def charge(self, mid: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Charge an account; ``fields`` are already validated (amount in cents)."""
        order_id = fields.get("order_id") or new_order_id()
        previous = self._approved_charge(mid, order_id)
        if previous is not None:
            return previous
        outcome = Outcome.for_cents(int(fields["amount"]))
        result, respcode, resptext = _RESPONSES.get(outcome, _RESPONSES[Outcome.APPROVED])
        approved = result == "A"
        vault_record = (
            self._ctx.vault.create(mid, {**fields, "created_by": "charge"})
            if approved and fields.get("vault") == "Y"
            else None
        )
        row = self._ledger.add(
            {
                **_charge_row(mid, order_id, fields),
                "auth_code": f"{self._ctx.rng.randrange(1_000_000):06d}" if approved else "",
                "resp_code": respcode,
                "resp_text": resptext,
                "result": result,
                "trans_status_id": _charge_status(result, capture=fields.get("capture") != "N"),
                "vault_id": (vault_record or {}).get("id") or fields.get("vault_id"),
            }
        )
        answer = _charge_answer(row)
        if vault_record is not None:
            answer["vault_id"] = vault_record["id"]
            answer["payment_account_uuid"] = vault_record["uuid"]
        elif fields.get("payment_account_uuid"):
            answer["vault_id"] = fields.get("vault_id")
            answer["payment_account_uuid"] = fields["payment_account_uuid"]
        if approved:
            self._answers.put(row["trans_id"], answer)
        return answer

    def _approved_charge(self, mid: str, order_id: str) -> dict[str, Any] | None:
        for row in self._ledger.find_order(mid, order_id):
            if row["result"] == "A" and row["trans_status_id"] != TransStatus.REFUND:
                return self._answers.get(row["trans_id"])
        return None

    # -- capture, void, refund -------------------------------------------------------------
    def transaction(self, mid: str, trans_id: str) -> dict[str, Any]:
        row = self._ledger.get(trans_id)
        if row is None or row["mid"] != mid:
            raise bad_request(f"no transaction {trans_id!r} for mid {mid}", "invalid_trans_id")
        return row

    def capture(self, mid: str, trans_id: str, amount: int | None) -> dict[str, Any]:
        row = self.transaction(mid, trans_id)
        status = row["trans_status_id"]
        if status == TransStatus.VOIDED:
            raise bad_request(f"transaction {trans_id} was voided", "transaction_voided")
        if status in (TransStatus.CAPTURED, TransStatus.SETTLED, TransStatus.PARTIALLY_REFUNDED,
                      TransStatus.REFUNDED):  # fmt: skip
            raise bad_request(f"transaction {trans_id} is already captured", "already_captured")
        if status != TransStatus.AUTHORIZED:
            raise bad_request(f"transaction {trans_id} is not an authorization", "not_capturable")
        authorized = int(row["authorized_cents"])
        if amount is not None and amount > authorized:
            raise bad_request(
                f"capture amount {amount} is above the authorized {authorized} cents",
                "amount_exceeds_authorization",
            )
        captured = self._ledger.update(
            trans_id, trans_status_id=TransStatus.CAPTURED, amount_cents=amount or authorized
        )
        return _charge_answer(captured)

    def void_or_refund(
        self, mid: str, trans_id: str, amount: int | None, user_identifier: str
    ) -> dict[str, Any]:
        row = self.transaction(mid, trans_id)
        status = row["trans_status_id"]
        if status == TransStatus.VOIDED:
            raise bad_request(f"transaction {trans_id} is already voided", "already_voided")
        if status == TransStatus.REFUNDED:
            raise bad_request(f"transaction {trans_id} is already refunded", "already_refunded")
        if status in (TransStatus.AUTHORIZED, TransStatus.CAPTURED):
            return self._void(row, amount, user_identifier)
        if status in (TransStatus.SETTLED, TransStatus.PARTIALLY_REFUNDED):
            return self._refund(row, amount, user_identifier)
        raise bad_request(
            f"transaction {trans_id} moved no money (status {status}); nothing to give back",
            "not_reversible",
        )

    def _void(self, row: dict[str, Any], amount: int | None, user: str) -> dict[str, Any]:
        original = int(row["amount_cents"])
        if amount is not None and amount > original:
            raise bad_request(
                f"amount {amount} is above the transaction's {original} cents", "amount_exceeds"
            )
        # a void has no row of its own: the voided row names who voided it (the interface's
        # "user that initiated the activity"; docs/interface-choices.md), None when not said
        voided = self._ledger.update(row["trans_id"], trans_status_id=TransStatus.VOIDED,
                                     user_identifier=user or None)
        return _reversal_answer(voided, "Voided", original, user)

    def _refund(self, row: dict[str, Any], amount: int | None, user: str) -> dict[str, Any]:
        refundable = int(row["amount_cents"]) - int(row["refunded_cents"])
        refund_cents = refundable if amount is None else amount
        if refund_cents > refundable:
            raise bad_request(
                f"amount {refund_cents} is above the {refundable} cents left to refund",
                "amount_exceeds",
            )
        refunded_total = int(row["refunded_cents"]) + refund_cents
        full = refunded_total == int(row["amount_cents"])
        with self._ctx.store.transaction():  # the refund row and the original move together
            self._ledger.update(
                row["trans_id"],
                refunded_cents=refunded_total,
                trans_status_id=TransStatus.REFUNDED if full else TransStatus.PARTIALLY_REFUNDED,
            )
            refund = self._ledger.add(self._refund_row(row, refund_cents, user))
        return _reversal_answer(refund, "Refunded", refund_cents, user)

    def _refund_row(self, row: dict[str, Any], cents: int, user: str) -> dict[str, Any]:
        return {
            "mid": row["mid"],
            "order_id": row["order_id"],
            "account_token": row["account_token"],
            "amount_cents": cents,
            "auth_code": f"{self._ctx.rng.randrange(1_000_000):06d}",
            "card_brand_id": row["card_brand_id"],
            "card_number": row["card_number"],
            "expiration": row["expiration"],
            "name": row["name"],
            "related_trans_id": row["trans_id"],
            "resp_code": "00",
            "resp_text": "Refunded",
            "result": "A",
            "terminal_id": row["terminal_id"],
            "trans_status_id": TransStatus.REFUND,
            "user_identifier": user or None,
            "currency": row["currency"],
        }


def _charge_status(result: str, *, capture: bool) -> TransStatus:
    if result == "B":
        return TransStatus.RETRY
    if result == "C":
        return TransStatus.DECLINED
    return TransStatus.CAPTURED if capture else TransStatus.AUTHORIZED


def _charge_row(mid: str, order_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The ledger fields a charge takes from its request."""
    token = str(fields["account_token"])
    return {
        "mid": mid,
        "order_id": order_id,
        "account_token": token,
        "amount_cents": int(fields["amount"]),
        "avs_resp": "Y" if fields.get("account_zip") else "",
        "cvv_resp": "M" if fields.get("cvn") else "",
        "card_brand_id": cards.brand_of(token),
        "card_number": cards.masked(token),
        "expiration": fields.get("expiration"),
        "name": fields.get("name"),
        "terminal_id": fields.get("terminal_id"),
        "user_identifier": fields.get("user_identifier"),
        "currency": fields.get("currency", "USD"),
        "interchange_per_item": "0.10",
        "interchange_rate": "0.0195",
        **{name: fields[name] for name in CUSTOM_FIELDS if fields.get(name)},
    }


def _charge_answer(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "result": row["result"],
        "respstat": row["result"],
        "trans_id": row["trans_id"],
        "order_id": row["order_id"],
        "auth_code": row["auth_code"] or "",
        "amount": int(row["amount_cents"]),
        "currency": row["currency"],
        "mid": row["mid"],
        "respcode": row["resp_code"],
        "resptext": row["resp_text"],
        "respproc": RESP_PROC,
    }


def _reversal_answer(row: dict[str, Any], text: str, amount: int, user: str) -> dict[str, Any]:
    return {
        "result": "A",
        "trans_id": row["trans_id"],
        "resp_code": "00",
        "resp_text": text,
        "resp_proc": RESP_PROC,
        "user_identifier": user,
        "mid": row["mid"],
        "amount": amount,
        "currency": row["currency"],
        "order_id": row["order_id"] or "",
        "auth_code": row["auth_code"] or "",
    }


# -- request parsing -----------------------------------------------------------------------
def merchant(request: web.Request, credential: Credential, body: Body | None = None) -> str:
    """The mid a call acts for: body ``mid``, else query ``mid``, checked against the key."""
    requested = body.text("mid") if body is not None else None
    return credential.resolve_mid(requested or request.query.get("mid"))


async def merchant_call(request: web.Request) -> tuple[SimContext, str, Body]:
    """A call with a JSON body: the simulator, the mid it acts for and the body. The key is
    checked before the body is read, so a bad key is a 401 whatever the body."""
    ctx = sim_context(request)
    credential = ctx.auth.authenticate(request)
    body = await read_json(request)
    return ctx, merchant(request, credential, body), body


def merchant_of(request: web.Request) -> tuple[SimContext, str]:
    """A call without a body: the simulator and the mid it acts for (query ``mid``)."""
    ctx = sim_context(request)
    return ctx, merchant(request, ctx.auth.authenticate(request))


def order_id_field(body: Body) -> str | None:
    """The ``order_id`` a charge names (None: one is made): up to 64 characters, not blank."""
    order_id = body.text("order_id", max_length=64)
    if order_id is not None and not order_id.strip():
        raise bad_request("field 'order_id' must not be empty")
    return order_id


def charge_fields(body: Body, ctx: SimContext, mid: str) -> dict[str, Any]:
    """Validate a charge body into the fields :meth:`Payments.charge` takes."""
    fields: dict[str, Any] = {"amount": body.req_cents("amount")}
    for name in _TEXT_FIELDS:
        value = body.text(name)
        if value is not None:
            fields[name] = value
    fields["currency"] = body.text("currency") or "USD"
    if not _CURRENCY.match(fields["currency"]):
        raise bad_request(
            f"field 'currency' must be three capital letters, got {fields['currency']!r}"
        )
    fields["capture"] = body.choice("capture", ("Y", "N"), default="Y")
    fields["vault"] = body.choice("vault", ("Y", "N"), default="N")
    fields["cof"] = body.choice("cof", ("C", "M"))
    fields["cof_sched"] = body.choice("cof_sched", ("Y", "N"))
    fields["cof_perm"] = body.choice("cof_perm", ("Y",))
    fields["order_id"] = order_id_field(body)
    _check_line_items(body)
    uuid = body.text("payment_account_uuid")
    if uuid is not None:
        _vaulted_account(fields, ctx, mid, uuid)
    else:
        fields["account_token"] = body.req_text("account_token", max_length=64)
        is_ach = any(name in fields for name in _ACH_FIELDS)
        expiration = body.text("expiration") if is_ach else body.req_text("expiration")
        if expiration is not None and not _EXPIRATION.match(expiration):
            raise bad_request(f"field 'expiration' must be MMYY, got {expiration!r}")
        fields["expiration"] = expiration
    if fields.get("email") and not _EMAIL.match(fields["email"]):
        raise bad_request(f"field 'email' is not an e-mail address: {fields['email']!r}")
    return fields


def _vaulted_account(fields: dict[str, Any], ctx: SimContext, mid: str, uuid: str) -> None:
    """A stored-credential charge: cof and cof_sched are required (choices.md)."""
    for name in ("cof", "cof_sched"):
        if fields.get(name) is None:
            raise bad_request(
                f"missing required field {name!r}: a charge of a vaulted account "
                "(payment_account_uuid) is a stored-credential charge"
            )
    account = ctx.vault.find(mid, uuid)
    if account is None:
        raise bad_request(
            f"no vault payment account {uuid!r} for mid {mid}", "invalid_payment_account"
        )
    fields["account_token"] = account["account_token"]
    fields["expiration"] = account["expiration"]
    fields["vault_id"] = account["id"]
    fields["payment_account_uuid"] = uuid
    fields.setdefault("name", account["name"])
    fields["vault"] = "N"


def _check_line_items(body: Body) -> None:
    items = body.array("line_items")
    for index, item in enumerate(items or []):
        if not isinstance(item, dict):
            raise bad_request(f"field 'line_items[{index}]' must be an object")


# -- handlers ------------------------------------------------------------------------------
async def handle_charge(request: web.Request) -> web.Response:
    ctx, mid, body = await merchant_call(request)
    return json_response(ctx.payments.charge(mid, charge_fields(body, ctx, mid)))


async def handle_capture(request: web.Request) -> web.Response:
    ctx, mid, body = await merchant_call(request)
    trans_id = body.req_text("trans_id")
    return json_response(ctx.payments.capture(mid, trans_id, body.cents("amount")))


async def handle_void_or_refund(request: web.Request) -> web.Response:
    ctx, mid, body = await merchant_call(request)
    answer = ctx.payments.void_or_refund(
        mid, body.req_text("trans_id"), body.cents("amount"), body.text("user_identifier") or ""
    )
    return json_response(answer)


async def handle_surcharge(request: web.Request) -> web.Response:
    merchant_of(request)  # the key, and the mid it may act for
    raw_amount = request.query.get("amount", "")
    if not raw_amount.isdigit() or int(raw_amount) < 1:
        raise bad_request(f"query parameter 'amount' must be integer cents, got {raw_amount!r}")
    card = request.query.get("account_token") or request.query.get("card_bin")
    if not card:
        raise bad_request("send 'account_token' or 'card_bin' as a query parameter")
    amount = int(raw_amount)
    if not cards.is_credit(card):
        return json_response(
            {"surcharge": False, "surcharge_amount": 0, "surcharge_percent": "0.00"}
        )
    return json_response(
        {
            "surcharge": True,
            "surcharge_amount": cards.surcharge_cents(amount),
            "surcharge_percent": cards.SURCHARGE_PERCENT,
        }
    )


async def handle_send_receipt(request: web.Request) -> web.Response:
    ctx, mid, body = await merchant_call(request)
    email = body.req_text("email")
    if not _EMAIL.match(email):
        raise bad_request(f"field 'email' is not an e-mail address: {email!r}")
    ctx.payments.transaction(mid, body.req_text("trans_id"))
    return json_response({"sent": True})


async def handle_refresh(request: web.Request) -> web.Response:
    """Key rotation. The bearer may be an expired key, so it is not authenticated first."""
    ctx = sim_context(request)
    bearer = bearer_token(request)
    body = await read_json(request)
    token = body.text("token")
    if bearer is None and token is None:
        raise ApiError(401, "unauthorized", "send the API key as bearer and the refresh token")
    return json_response(ctx.auth.refresh(bearer, token))


def setup(app: web.Application, ctx: SimContext) -> None:
    ctx.payments = Payments(ctx)
    app.router.add_post("/api/v1/charge", handle_charge)
    app.router.add_post("/api/v1/capture", handle_capture)
    app.router.add_post("/api/v1/void-or-refund", handle_void_or_refund)
    app.router.add_get("/api/v1/surcharge", handle_surcharge)
    app.router.add_post("/api/v1/send_receipt", handle_send_receipt)
    app.router.add_post("/api/v1/api_keys/refresh", handle_refresh)
