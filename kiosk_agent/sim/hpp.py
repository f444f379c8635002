"""Hosted payment pages: create, edit, and a real page at the returned url where a customer pays.

The page is plain HTML with a form; its POST tokenizes the card number at once (the number is
never stored or logged) and charges through payments, so the payment reaches the ledger and
reporting like any other. ``hpp_client_id`` is the url's last path segment (choices.md).
"""

from __future__ import annotations

import html
import secrets
from typing import Any

from aiohttp import web

from kiosk_agent.money import MoneyError, cents_to_dollars, dollars_to_cents
from kiosk_agent.sim import cards
from kiosk_agent.sim.auth import Credential
from kiosk_agent.sim.context import SimContext, sim_context
from kiosk_agent.sim.http import (
    ApiError,
    Body,
    bad_request,
    json_response,
    not_found,
    read_json,
)

OPTION_NAMES = frozenset(
    ("custom_01", "custom_02", "custom_03", "custom_04", "custom_05", "invoice_id", "address",
     "phone", "email")
)  # fmt: skip
_AMOUNT_FIELDS = ("amount", "min_amount", "max_amount")
_EDITABLE = ("name", "ach_mid", "name_on_account", "lock_amount", "disable_after_payment",
             "hpp_options", *_AMOUNT_FIELDS)  # fmt: skip


class HostedPages:
    def __init__(self, ctx: SimContext) -> None:
        self._ctx = ctx
        self._pages = ctx.store.documents("hosted_pages")

    def create(self, credential: Credential, fields: dict[str, Any]) -> dict[str, Any]:
        page: dict[str, Any] = {
            "hpp_client_id": secrets.token_hex(12),
            "name": None, "cc_mid": None, "ach_mid": None, "name_on_account": None,
            "amount": None, "min_amount": None, "max_amount": None, "lock_amount": False,
            "disable_after_payment": False, "hpp_options": [], "disabled": False,
            "payments": [],
        }  # fmt: skip
        page.update(fields)
        _check_page(page, credential)
        self._pages.put(page["hpp_client_id"], page)
        return page

    def edit(self, credential: Credential, page_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        page = self.page(page_id)
        if not _owned(page, credential):
            raise not_found(f"no hosted payment page {page_id!r}", "hpp_not_found")
        page.update(changes)
        _check_page(page, credential)
        self._pages.put(page_id, page)
        return page

    def page(self, page_id: str) -> dict[str, Any]:
        page = self._pages.get(page_id)
        if page is None:
            raise not_found(f"no hosted payment page {page_id!r}", "hpp_not_found")
        return page

    def pay(self, page_id: str, form: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A customer's submission: the page and the charge answer."""
        page = self.page(page_id)
        if page["disabled"]:
            raise bad_request("this payment page is disabled", "hpp_disabled")
        amount_cents = _form_amount(page, form)
        card_number = "".join(ch for ch in form.get("card_number", "") if ch.isdigit())
        if not 12 <= len(card_number) <= 19:
            raise bad_request("card number must have 12 to 19 digits")
        expiration = form.get("expiration", "").replace("/", "").strip()
        mid = page["cc_mid"] or page["ach_mid"]
        answer = self._ctx.payments.charge(
            mid,
            {
                "amount": amount_cents,
                "account_token": cards.tokenize(card_number, self._ctx.rng),
                "expiration": expiration,
                "name": form.get("name") or page["name_on_account"],
                "capture": "Y",
            },
        )
        page["payments"].append(answer["trans_id"])
        if answer["result"] == "A" and page["disable_after_payment"]:
            page["disabled"] = True
        self._pages.put(page_id, page)
        return page, answer


def _owned(page: dict[str, Any], credential: Credential) -> bool:
    return any(mid in credential.mids for mid in (page["cc_mid"], page["ach_mid"]) if mid)


def _check_page(page: dict[str, Any], credential: Credential) -> None:
    if not page["cc_mid"] and not page["ach_mid"]:
        raise bad_request("send 'cc_mid' or 'ach_mid': a page needs a merchant to pay")
    for name in ("cc_mid", "ach_mid"):
        if page[name] and page[name] not in credential.mids:
            raise bad_request(f"{name} {page[name]!r} is not an account this key may act for",
                              "invalid_mid")  # fmt: skip
    if page["lock_amount"] and (page["min_amount"] or page["max_amount"]):
        raise bad_request("min_amount and max_amount are valid only when lock_amount is false")
    if page["lock_amount"] and not page["amount"]:
        raise bad_request("a locked amount needs 'amount'")
    low = dollars_to_cents(page["min_amount"]) if page["min_amount"] else None
    high = dollars_to_cents(page["max_amount"]) if page["max_amount"] else None
    if low is not None and high is not None and low > high:
        raise bad_request(
            f"min_amount {page['min_amount']} is above max_amount {page['max_amount']}"
        )


def _form_amount(page: dict[str, Any], form: dict[str, str]) -> int:
    text = page["amount"] if page["lock_amount"] else form.get("amount") or page["amount"]
    try:
        cents = dollars_to_cents(str(text or "").strip())
    except MoneyError:
        raise bad_request(f"amount must be dollars like 12.50, got {text!r}") from None
    low = dollars_to_cents(page["min_amount"]) if page["min_amount"] else 1
    high = dollars_to_cents(page["max_amount"]) if page["max_amount"] else None
    if cents < low or (high is not None and cents > high):
        raise bad_request(f"amount {cents_to_dollars(cents)} is outside this page's range")
    return cents


def page_fields(body: Body, *, creating: bool) -> dict[str, Any]:
    """Validate a create/edit body; on edit only the fields sent are returned."""
    if not creating and "cc_mid" in body.data:
        raise bad_request("cc_mid cannot be changed after creation", "cc_mid_immutable")
    allowed = {*_EDITABLE, "cc_mid"}
    unknown = set(body.data) - allowed
    if unknown:
        raise bad_request(f"unknown field {sorted(unknown)[0]!r} for a hosted payment page")
    fields: dict[str, Any] = {}
    if creating:
        fields["name"] = body.req_text("name", max_length=128)
        fields["cc_mid"] = body.text("cc_mid")
    elif "name" in body:
        fields["name"] = body.req_text("name", max_length=128)
    for name in ("ach_mid", "name_on_account"):
        if name in body.data:
            fields[name] = body.text(name)
    for name in ("lock_amount", "disable_after_payment"):
        if name in body.data:
            fields[name] = body.flag(name)
    for name in _AMOUNT_FIELDS:
        if name in body.data:
            fields[name] = _amount_field(body, name)
    if "hpp_options" in body.data:
        fields["hpp_options"] = _options(body)
    return fields


def _amount_field(body: Body, name: str) -> str | None:
    cents = body.dollars(name)
    return None if cents is None else cents_to_dollars(cents)


def _options(body: Body) -> list[dict[str, Any]]:
    options = []
    for index, item in enumerate(body.array("hpp_options") or []):
        where = f"hpp_options[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"field {where!r} must be an object")
        option = Body(item)
        name = option.text("name")
        if name is not None and name not in OPTION_NAMES:
            allowed = ", ".join(sorted(OPTION_NAMES))
            raise bad_request(f"field '{where}.name' must be one of {allowed}")
        options.append(
            {
                "name": name,
                "value": option.text("value"),
                "is_readonly": option.flag("is_readonly"),
                "is_required": option.flag("is_required"),
            }
        )
    return options


def page_url(request: web.Request, page_id: str) -> str:
    return f"{request.scheme}://{request.host}/hpp/{page_id}"


async def handle_create(request: web.Request) -> web.Response:
    ctx = sim_context(request)
    credential = ctx.auth.authenticate(request)
    body = await read_json(request)
    page = ctx.hosted_pages.create(credential, page_fields(body, creating=True))
    return json_response({"url": page_url(request, page["hpp_client_id"])})


async def handle_edit(request: web.Request) -> web.Response:
    ctx = sim_context(request)
    credential = ctx.auth.authenticate(request)
    body = await read_json(request)
    page_id = request.match_info["hpp_client_id"]
    page = ctx.hosted_pages.edit(credential, page_id, page_fields(body, creating=False))
    return json_response({"url": page_url(request, page_id), **_public(page)})


def _public(page: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in page.items() if k not in ("payments",)}


async def handle_page(request: web.Request) -> web.Response:
    ctx = sim_context(request)
    page = ctx.hosted_pages.page(request.match_info["hpp_client_id"])
    return web.Response(text=render_page(page), content_type="text/html")


async def handle_pay(request: web.Request) -> web.Response:
    ctx = sim_context(request)
    form = {key: str(value) for key, value in (await request.post()).items()}
    try:
        page, answer = ctx.hosted_pages.pay(request.match_info["hpp_client_id"], form)
    except ApiError as err:  # a person reads this answer: a page, not JSON
        body = f'<p class="error">{html.escape(err.description)}</p>'
        return web.Response(
            text=_html("Payment", body), status=err.status, content_type="text/html"
        )
    return web.Response(text=render_receipt(page, answer), content_type="text/html")


def render_page(page: dict[str, Any]) -> str:
    esc = html.escape
    title = esc(page["name"] or "Payment")
    if page["disabled"]:
        return _html(title, "<p>This payment page is no longer available.</p>")
    amount = esc(page["amount"] or "")
    readonly = " readonly" if page["lock_amount"] else ""
    extra = "".join(
        f'<label>{esc(o["name"] or "")}<input name="{esc(o["name"] or "")}" '
        f'value="{esc(o["value"] or "")}"{" readonly" if o["is_readonly"] else ""}'
        f"{' required' if o['is_required'] else ''}></label>"
        for o in page["hpp_options"]
        if o["name"]
    )
    form = (
        f'<form method="post" action="/hpp/{esc(page["hpp_client_id"])}/pay">'
        f'<label>Name<input name="name" value="{esc(page["name_on_account"] or "")}"></label>'
        f'<label>Amount (USD)<input name="amount" value="{amount}"{readonly} required></label>'
        '<label>Card number<input name="card_number" autocomplete="cc-number" required></label>'
        '<label>Expiration (MMYY)<input name="expiration" autocomplete="cc-exp" required></label>'
        f'{extra}<button type="submit">Pay</button></form>'
    )
    return _html(title, form)


def render_receipt(page: dict[str, Any], answer: dict[str, Any]) -> str:
    esc = html.escape
    verdict = {"A": "Approved", "B": "Please try again", "C": "Declined"}.get(answer["result"], "")
    body = (
        f'<p class="result" data-result="{esc(answer["result"])}">{verdict}</p>'
        f"<p>Amount: ${esc(cents_to_dollars(int(answer['amount'])))}</p>"
        f"<p>Reference: {esc(answer['trans_id'])}</p>"
    )
    return _html(esc(page["name"] or "Payment"), body)


def _html(title: str, body: str) -> str:
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>'
        f"<body><h1>{title}</h1>{body}</body></html>"
    )


def setup(app: web.Application, ctx: SimContext) -> None:
    ctx.hosted_pages = HostedPages(ctx)
    app.router.add_post("/api/v1/hpp", handle_create)
    app.router.add_put("/api/v1/hpp/{hpp_client_id}", handle_edit)
    app.router.add_get("/hpp/{hpp_client_id}", handle_page)
    app.router.add_post("/hpp/{hpp_client_id}/pay", handle_pay)
