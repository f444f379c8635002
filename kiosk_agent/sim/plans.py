"""Billing plans: scheduled payments generated from the RFC 5545 rule, charged on virtual time.

The rule is read with python-dateutil's rrule. Payments are numbered from 1; ``UNTIL`` is
inclusive; a rule without ``UNTIL`` or ``COUNT`` lists its next 12 payments and keeps 12
pending ahead as they are made. A payment falls due when the virtual clock passes its date:
the next read of the plan charges the vaulted account (``cof: M``, ``cof_sched: Y``), so a test
at a high time scale sees a plan being paid. Cancelling skips every pending payment.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from aiohttp import web
from dateutil.rrule import rrule, rrulestr

from kiosk_agent.money import cents_to_decimal, cents_to_dollars
from kiosk_agent.sim.clock import iso_ms, parse_iso
from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import bad_request, json_response, not_found
from kiosk_agent.sim.payments import merchant_call, merchant_of

OPEN_ENDED_AHEAD = 12
MAX_PAYMENTS = 1000
_ENDED = re.compile(r"(^|;)(UNTIL|COUNT)=", re.IGNORECASE)
_FLOATING_START = re.compile(r"^DTSTART:\d{8}T\d{6}$", re.IGNORECASE)


class BillingPlans:
    def __init__(self, ctx: SimContext) -> None:
        self._ctx = ctx
        self._plans = ctx.store.documents("billing_plans")

    def create(self, mid: str, fields: dict[str, Any]) -> int:
        if any(plan["mid"] == mid for plan in self._plans.find("name", fields["name"])):
            raise bad_request(f"a billing plan named {fields['name']!r} exists", "duplicate_name")
        if self._ctx.vault.find(mid, fields["payment_account_uuid"]) is None:
            raise bad_request(
                f"no vault payment account {fields['payment_account_uuid']!r} for mid {mid}",
                "invalid_payment_account",
            )
        rule, open_ended = parse_rule(fields["rrule_pattern"])
        plan_id = self._ctx.store.next_id("billing_plan")
        plan = {
            "id": plan_id,
            "mid": mid,
            "status": "ACTIVE",
            "open_ended": open_ended,
            "scheduled_payments": [],
            **fields,
        }
        dates = _dates(rule, open_ended, after=self._ctx.clock.now(), count=OPEN_ENDED_AHEAD)
        for date in dates:
            self._add_payment(plan, date)
        self._plans.put(plan_id, plan)
        return plan_id

    def _add_payment(self, plan: dict[str, Any], date: datetime) -> None:
        payments = plan["scheduled_payments"]
        payments.append(
            {
                "id": self._ctx.store.next_id("scheduled_payment"),
                "payment_number": len(payments) + 1,
                "payment_date": iso_ms(date),
                "amount_cents": plan["amount_cents"],
                "paid_cents": 0,
                "payment_status": "PENDING",
            }
        )

    def get(self, mid: str, plan_id: int) -> dict[str, Any]:
        plan = self._plans.get(plan_id)
        if plan is None or plan["mid"] != mid:
            raise not_found(f"no billing plan {plan_id}", "billing_plan_not_found")
        if plan["status"] == "ACTIVE" and self._run_due_payments(plan):
            self._plans.put(plan_id, plan)
        return plan

    def cancel(self, mid: str, plan_id: int) -> dict[str, Any]:
        plan = self.get(mid, plan_id)
        if plan["status"] in ("ACTIVE", "PAUSED"):
            plan["status"] = "CANCELLED"
            for payment in plan["scheduled_payments"]:
                if payment["payment_status"] == "PENDING":
                    payment["payment_status"] = "SKIPPED"
            self._plans.put(plan_id, plan)
        return plan

    def _run_due_payments(self, plan: dict[str, Any]) -> bool:
        now = self._ctx.clock.time()
        changed = False
        for payment in plan["scheduled_payments"]:
            if payment["payment_status"] == "PENDING" and parse_iso(payment["payment_date"]) <= now:
                self._pay(plan, payment)
                changed = True
        if changed and plan["open_ended"]:
            self._top_up(plan)
        elif changed and all(p["payment_status"] != "PENDING" for p in plan["scheduled_payments"]):
            plan["status"] = "COMPLETED"
        return changed

    def _pay(self, plan: dict[str, Any], payment: dict[str, Any]) -> None:
        account = self._ctx.vault.find(plan["mid"], plan["payment_account_uuid"])
        if account is None:
            payment["payment_status"] = "FAILED"
            return
        answer = self._ctx.payments.charge(
            plan["mid"],
            {
                "amount": payment["amount_cents"],
                "account_token": account["account_token"],
                "expiration": account["expiration"],
                "order_id": f"PLAN{plan['id']}-{payment['payment_number']}",
                "cof": "M",
                "cof_sched": "Y",
                "vault_id": account["id"],
                "payment_account_uuid": account["uuid"],
                "name": account["name"],
            },
        )
        if answer["result"] == "A":
            payment["paid_cents"] = payment["amount_cents"]
            payment["payment_status"] = "COMPLETED"
            payment["trans_id"] = answer["trans_id"]
        else:
            payment["payment_status"] = "FAILED"

    def _top_up(self, plan: dict[str, Any]) -> None:
        rule, _ = parse_rule(plan["rrule_pattern"])
        pending = sum(p["payment_status"] == "PENDING" for p in plan["scheduled_payments"])
        last_date = plan["scheduled_payments"][-1]["payment_date"]
        last = datetime.fromtimestamp(parse_iso(last_date), UTC)
        wanted = OPEN_ENDED_AHEAD - pending
        for date in _dates(rule, True, after=last, count=wanted, inclusive=False):
            self._add_payment(plan, date)


def parse_rule(pattern: str) -> tuple[rrule, bool]:
    """The rule and whether it is open-ended; a 400 naming ``rrule_pattern`` when malformed."""
    lines = [line.strip() for line in pattern.strip().splitlines() if line.strip()]
    shaped = len(lines) == 2 and lines[0].upper().startswith("DTSTART")
    if not shaped or not lines[1].upper().startswith("RRULE:"):
        raise bad_request(
            "field 'rrule_pattern' must be a DTSTART line, a line feed and an RRULE line"
        )
    if _FLOATING_START.match(lines[0]):
        lines[0] += "Z"  # a floating start time is read as UTC, like every date here
    if "FREQ=" not in lines[1].upper():
        raise bad_request("field 'rrule_pattern' has no FREQ in its RRULE line")
    try:
        rule = rrulestr("\n".join(lines))
    except (ValueError, TypeError) as err:
        raise bad_request(f"field 'rrule_pattern' is not a valid RFC 5545 rule: {err}") from None
    if not isinstance(rule, rrule):
        raise bad_request("field 'rrule_pattern' must hold exactly one RRULE")
    open_ended = not _ENDED.search(lines[1].split(":", 1)[1])
    return rule, open_ended


def _dates(
    rule: rrule, open_ended: bool, after: datetime, count: int, inclusive: bool = True
) -> list[datetime]:
    if not open_ended:
        dates: list[datetime] = []
        for date in rule:
            dates.append(date)
            if len(dates) > MAX_PAYMENTS:
                raise bad_request(f"field 'rrule_pattern' makes more than {MAX_PAYMENTS} payments")
        return dates
    found: list[datetime] = []
    upcoming = rule.after(after, inc=inclusive)
    while upcoming is not None and len(found) < count:
        found.append(upcoming)
        upcoming = rule.after(upcoming)
    return found


def plan_resource(plan: dict[str, Any]) -> dict[str, Any]:
    """The interface's billing plan: amount as a dollar string, payments as dollar numbers."""
    return {
        "id": plan["id"],
        "name": plan["name"],
        "description": plan.get("description"),
        "mid": plan["mid"],
        "payment_account_uuid": plan["payment_account_uuid"],
        "status": plan["status"],
        "rrule_pattern": plan["rrule_pattern"],
        "amount": cents_to_dollars(plan["amount_cents"]),
        "scheduled_payments": [_payment_resource(p) for p in plan["scheduled_payments"]],
    }


def _payment_resource(payment: dict[str, Any]) -> dict[str, Any]:
    scheduled: Decimal = cents_to_decimal(payment["amount_cents"])
    paid: Decimal = cents_to_decimal(payment["paid_cents"])
    return {
        "id": payment["id"],
        "payment_number": payment["payment_number"],
        "payment_date": payment["payment_date"],
        "amount_scheduled": scheduled,
        "amount_paid": paid,
        "amount_remaining": scheduled - paid,
        "payment_status": payment["payment_status"],
    }


def _plan_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not raw.isdigit():
        raise not_found(f"no billing plan {raw!r}", "billing_plan_not_found")
    return int(raw)


async def handle_create(request: web.Request) -> web.Response:
    ctx, mid, body = await merchant_call(request)
    body.req_text("mid")  # required by the interface, like the other fields (resolved above)
    amount_cents = body.req_dollars("amount")
    description = body.text("description", required=False, max_length=1024)
    if "description" not in body.data:
        raise bad_request("missing required field 'description'")
    fields = {
        "name": body.req_text("name", max_length=128),
        "description": description,
        "payment_account_uuid": body.req_text("payment_account_uuid"),
        "rrule_pattern": body.req_text("rrule_pattern", max_length=1024),
        "amount_cents": amount_cents,
    }
    return json_response({"id": ctx.plans.create(mid, fields)})


async def handle_get(request: web.Request) -> web.Response:
    ctx, mid = merchant_of(request)
    return json_response(plan_resource(ctx.plans.get(mid, _plan_id(request))))


async def handle_cancel(request: web.Request) -> web.Response:
    ctx, mid = merchant_of(request)
    return json_response(plan_resource(ctx.plans.cancel(mid, _plan_id(request))))


def setup(app: web.Application, ctx: SimContext) -> None:
    ctx.plans = BillingPlans(ctx)
    app.router.add_post("/api/v1/billing_plans", handle_create)
    app.router.add_get("/api/v1/billing_plans/{id}", handle_get)
    app.router.add_delete("/api/v1/billing_plans/{id}", handle_cancel)
