"""Boarding: merchants, their status moves, and the webhook event each move makes.

``{reporting_url}/ords/sprint/api/3p/boarding/v1/merchants`` (OAuth bearer, like reporting):
list (``q`` filters, ORDS pages), create (201, ``merchant.new`` reason ``created``), get, and
update (PUT). Through the API ``merchant_status`` may only be ``new`` (retract an application out
for signature) or ``sent_for_signature`` (send it, or resend: one event, reason ``resent``);
editing an application out for signature takes it back to new (``merchant.new``, reason
``updated``). Every other move is the service's own, played by ``POST /sim/merchants/{id}/status``
and by the sweep that expires applications left unsigned for 30 simulated days.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

from aiohttp import web

from kiosk_agent.service.models.boarding import MerchantReason, MerchantStatus, MerchantTrigger
from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import (
    ApiError,
    Body,
    bad_request,
    json_response,
    not_found,
    read_json,
)
from kiosk_agent.sim.oauth import require_token
from kiosk_agent.sim.reporting import ords_page, page_params, parse_q
from kiosk_agent.sim.store import Store, UnknownFieldError
from kiosk_agent.sim.webhooks import WebhookDispatcher
from kiosk_agent.sim.webhooks import setup as setup_webhooks
from kiosk_agent.tasks import BackgroundTask

MERCHANTS_PATH = "/ords/sprint/api/3p/boarding/v1/merchants"
SIGNATURE_EXPIRY_S = 30 * 86400.0  # simulated seconds an application may wait for signature
DELETED = "deleted"

# The merchant record: the webhook payload's fields plus legal_name, created, updated.
RECORD_FIELDS = (
    "merchant_id", "mid", "rep_code_id", "customer_id", "dba_name", "merchant_status_id",
    "external_crm_id", "custom_01", "legal_name", "created", "updated",
)  # fmt: skip
PAYLOAD_FIELDS = RECORD_FIELDS[:8]
EDITABLE_TEXT = ("dba_name", "legal_name", "external_crm_id", "custom_01")
EDITABLE_INT = ("rep_code_id", "customer_id")

_DDL = """
CREATE TABLE IF NOT EXISTS merchants (
    merchant_id INTEGER PRIMARY KEY,
    mid TEXT,
    rep_code_id INTEGER,
    customer_id INTEGER,
    dba_name TEXT NOT NULL,
    merchant_status_id INTEGER NOT NULL,
    external_crm_id TEXT,
    custom_01 TEXT,
    legal_name TEXT,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    signature_sent_at REAL
);
CREATE INDEX IF NOT EXISTS merchants_status ON merchants (merchant_status_id);
"""

# The reason a move to each status gives when nothing more specific applies.
_STATUS_REASONS = {
    MerchantStatus.NEW: MerchantReason.STATUS_CHANGED,
    MerchantStatus.SENT_FOR_SIGNATURE: MerchantReason.SENT_FOR_SIGNATURE,
    MerchantStatus.SIGNED: MerchantReason.SIGNED,
    MerchantStatus.IN_UNDERWRITING: MerchantReason.IN_UNDERWRITING,
    MerchantStatus.BOARDED: MerchantReason.BOARDED,
    MerchantStatus.LIVE: MerchantReason.LIVE,
    MerchantStatus.CANCELLED: MerchantReason.CANCELLED,
    MerchantStatus.DECLINED: MerchantReason.DECLINED,
    MerchantStatus.UNKNOWN: MerchantReason.STATUS_CHANGED,
}
# Statuses the API may move a merchant out of: an application not yet signed.
_API_MOVABLE = (MerchantStatus.NEW, MerchantStatus.SENT_FOR_SIGNATURE)
# An application back at new (retracted, edited while out, or its signature expired): no
# signature is awaited any more.
_BACK_TO_NEW: dict[str, Any] = {
    "merchant_status_id": int(MerchantStatus.NEW),
    "signature_sent_at": None,
}
API_STATUSES = (MerchantStatus.NEW.api_name, MerchantStatus.SENT_FOR_SIGNATURE.api_name)
TRIGGERS = tuple(trigger.value for trigger in MerchantTrigger)


class Boarding:
    """The merchants table and every status move, each announced through the dispatcher."""

    def __init__(self, store: Store, clock: VirtualClock, webhooks: WebhookDispatcher) -> None:
        self._store = store
        self._clock = clock
        self._webhooks = webhooks
        self.changed = asyncio.Event()  # wakes the signature sweep when deadlines move
        store.create(_DDL)

    # -- reading ---------------------------------------------------------------------------
    def get(self, merchant_id: int) -> dict[str, Any]:
        row = self._store.row("SELECT * FROM merchants WHERE merchant_id = ?", (merchant_id,))
        if row is None:
            raise not_found(f"no merchant {merchant_id}", "merchant_not_found")
        return row

    def page(
        self, filters: dict[str, Any], limit: int, offset: int
    ) -> tuple[list[dict[str, Any]], bool]:
        return self._store.page("merchants", RECORD_FIELDS, filters, limit, offset, "merchant_id")

    # -- API moves -------------------------------------------------------------------------
    def create(self, fields: dict[str, Any]) -> dict[str, Any]:
        merchant_id = self._store.next_id("merchant_id", start=100001)
        now = self._clock.iso_now()
        row = {
            "merchant_id": merchant_id,
            "mid": None,
            "rep_code_id": 1001,
            "customer_id": self._store.next_id("customer_id", start=200001),
            "merchant_status_id": int(MerchantStatus.NEW),
            "external_crm_id": None,
            "custom_01": None,
            "legal_name": None,
            **fields,
            "created": now,
            "updated": now,
            "signature_sent_at": None,
        }
        columns = ", ".join(row)
        self._store.execute(
            f"INSERT INTO merchants ({columns}) VALUES ({', '.join(':' + c for c in row)})",  # noqa: S608
            row,
        )
        return self._emit(self.get(merchant_id), MerchantReason.CREATED, MerchantTrigger.API)

    def update(
        self, merchant_id: int, fields: dict[str, Any], status: str | None
    ) -> dict[str, Any]:
        """A PUT: edit fields, then move to ``status`` (``new`` or ``sent_for_signature``)."""
        row = self.get(merchant_id)
        if status is not None and row["merchant_status_id"] not in _API_MOVABLE:
            # Checked before any field changes, so a refused PUT changes nothing at all.
            raise _cannot_move(row, MerchantStatus.from_name(status))
        if fields:
            out_for_signature = row["merchant_status_id"] == MerchantStatus.SENT_FOR_SIGNATURE
            changes = dict(fields)
            if out_for_signature:
                # The signer would sign what is no longer true: the application goes back to new.
                changes.update(_BACK_TO_NEW)
            row = self._save(merchant_id, changes)
            if out_for_signature:
                self._emit(row, MerchantReason.UPDATED, MerchantTrigger.API)
        if status == MerchantStatus.SENT_FOR_SIGNATURE.api_name:
            row = self._send_for_signature(row, MerchantTrigger.API)
        elif status == MerchantStatus.NEW.api_name:
            row = self._retract(row)
        return row

    def _send_for_signature(
        self, row: dict[str, Any], trigger: MerchantTrigger, *, from_any: bool = False
    ) -> dict[str, Any]:
        current = row["merchant_status_id"]
        if not from_any and current not in _API_MOVABLE:
            raise _cannot_move(row, MerchantStatus.SENT_FOR_SIGNATURE)
        resend = current == MerchantStatus.SENT_FOR_SIGNATURE
        # A resend restarts the 30-day wait for a signature.
        row = self._save(
            row["merchant_id"],
            {
                "merchant_status_id": int(MerchantStatus.SENT_FOR_SIGNATURE),
                "signature_sent_at": self._clock.time(),
            },
        )
        reason = MerchantReason.RESENT if resend else MerchantReason.SENT_FOR_SIGNATURE
        return self._emit(row, reason, trigger)

    def _retract(self, row: dict[str, Any]) -> dict[str, Any]:
        current = row["merchant_status_id"]
        if current == MerchantStatus.NEW:
            return row  # already new: nothing to retract, nothing to announce
        if current != MerchantStatus.SENT_FOR_SIGNATURE:
            raise _cannot_move(row, MerchantStatus.NEW)
        row = self._save(row["merchant_id"], _BACK_TO_NEW)
        return self._emit(row, MerchantReason.RETRACTED, MerchantTrigger.API)

    # -- the service's own moves -----------------------------------------------------------
    def force_status(
        self, merchant_id: int, status: str, trigger: MerchantTrigger, deleted_by: str
    ) -> dict[str, Any]:
        """Any move at all, as the service's back office makes them (``/sim`` helper)."""
        row = self.get(merchant_id)
        if status == DELETED:
            self._store.execute("DELETE FROM merchants WHERE merchant_id = ?", (merchant_id,))
            self.changed.set()
            return self._emit(
                row, MerchantReason.DELETED, trigger, "merchant.deleted", deleted_by=deleted_by
            )
        target = MerchantStatus.from_name(status)
        if target is MerchantStatus.SENT_FOR_SIGNATURE:
            return self._send_for_signature(row, trigger, from_any=True)
        previous = row["merchant_status_id"]
        changes: dict[str, Any] = {"merchant_status_id": int(target), "signature_sent_at": None}
        if target is MerchantStatus.BOARDED and row["mid"] is None:
            changes["mid"] = _assigned_mid(merchant_id)
        row = self._save(merchant_id, changes)
        reason = _STATUS_REASONS[target]
        if target is MerchantStatus.NEW and previous == MerchantStatus.SENT_FOR_SIGNATURE:
            reason = MerchantReason.RETRACTED
        self._emit(row, reason, trigger)
        if target is MerchantStatus.BOARDED:
            self._webhooks.emit("boarding.varcomplete", str(merchant_id), _var_payload(row))
        return row

    def next_signature_deadline(self) -> float | None:
        found = self._store.row(
            "SELECT MIN(signature_sent_at) AS first FROM merchants WHERE merchant_status_id = ?",
            (int(MerchantStatus.SENT_FOR_SIGNATURE),),
        )
        first = None if found is None else found["first"]
        return None if first is None else float(first) + SIGNATURE_EXPIRY_S

    def expire_signatures(self) -> int:
        """Applications unsigned for 30 simulated days go back to new (trigger ``system``)."""
        cutoff = self._clock.time() - SIGNATURE_EXPIRY_S
        expired = self._store.rows(
            "SELECT merchant_id FROM merchants WHERE merchant_status_id = ? "
            "AND signature_sent_at <= ? ORDER BY signature_sent_at",
            (int(MerchantStatus.SENT_FOR_SIGNATURE), cutoff),
        )
        for found in expired:
            row = self._save(found["merchant_id"], _BACK_TO_NEW)
            self._emit(row, MerchantReason.SIGNATURE_EXPIRED, MerchantTrigger.SYSTEM)
        return len(expired)

    # -- plumbing --------------------------------------------------------------------------
    def _save(self, merchant_id: int, changes: dict[str, Any]) -> dict[str, Any]:
        changes = {**changes, "updated": self._clock.iso_now()}
        assignments = ", ".join(f"{name} = :{name}" for name in changes)
        self._store.execute(
            f"UPDATE merchants SET {assignments} WHERE merchant_id = :merchant_id",  # noqa: S608
            {**changes, "merchant_id": merchant_id},
        )
        if "signature_sent_at" in changes:
            self.changed.set()
        return self.get(merchant_id)

    def _emit(
        self,
        row: dict[str, Any],
        reason: MerchantReason,
        trigger: MerchantTrigger,
        event_type: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        status = MerchantStatus(row["merchant_status_id"])
        payload = {name: row[name] for name in PAYLOAD_FIELDS}
        payload.update(
            trigger=trigger.value,
            reason=reason.value,
            timestamp=self._clock.iso_now().replace("Z", "+00:00"),
            **extra,
        )
        kind = event_type or f"merchant.{status.api_name}"
        self._webhooks.emit(kind, str(row["merchant_id"]), payload)
        return row


def merchant_resource(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in RECORD_FIELDS}


def _assigned_mid(merchant_id: int) -> str:
    return f"{998000000000 + merchant_id:012d}"


def _var_payload(row: dict[str, Any]) -> dict[str, str]:
    """The acquirer's VAR sheet for a boarded merchant (every value a string)."""
    merchant_id = int(row["merchant_id"])
    return {
        "merchant_id": str(merchant_id),
        "acquirer_bin": "412345",
        "agent_bank_number": "081000",
        "agent_chain_number": "000001",
        "city": "Springfield",
        "zip_code": "62701",
        "contact_phone": "2175550100",
        "merchant_aba_number": "071000013",
        "merchant_category_code": "5999",
        "merchant_location_number": "00001",
        "dba_name": str(row["dba_name"]),
        "mid": str(row["mid"]),
        "merchant_settlement_agent_number": "0001",
        "state": "IL",
        "store_number": f"{merchant_id % 10000:04d}",
        "terminal_id": f"V{merchant_id:07d}",
        "terminal_number": "0001",
        "time_zone": "America/Chicago",
    }


def _cannot_move(row: dict[str, Any], target: MerchantStatus) -> ApiError:
    current = MerchantStatus(row["merchant_status_id"]).api_name
    return ApiError(
        409,
        "invalid_status_transition",
        f"merchant {row['merchant_id']} is {current}; it cannot move to {target.api_name}",
    )


# -- HTTP -------------------------------------------------------------------------------------
BOARDING_KEY = web.AppKey("sim_boarding", Boarding)


def _merchant_id(request: web.Request) -> int:
    raw = request.match_info["merchant_id"]
    if not raw.isdigit():
        raise bad_request(f"merchant_id must be an integer, got {raw!r}")
    return int(raw)


def _fields(body: Body, *, creating: bool) -> dict[str, Any]:
    """The merchant fields of a create or update body; anything unknown is a 400 naming it."""
    known = (*EDITABLE_TEXT, *EDITABLE_INT, *(() if creating else ("merchant_status",)))
    unknown = sorted(set(body.data) - set(known))
    if unknown:
        raise bad_request(
            f"unknown field {unknown[0]!r}; a merchant takes {', '.join(known)}"
        )
    fields: dict[str, Any] = {}
    for name in EDITABLE_TEXT:
        if name in body:
            fields[name] = body.text(name, required=name == "dba_name", max_length=200)
    for name in EDITABLE_INT:
        if name in body:
            fields[name] = body.integer(name, minimum=1)
    if creating and "dba_name" not in fields:
        raise bad_request("missing required field 'dba_name'")
    return fields


async def list_merchants(request: web.Request) -> web.Response:
    require_token(request)
    limit, offset = page_params(request)
    filters = parse_q(request.query.get("q"))
    try:
        rows, has_more = request.app[BOARDING_KEY].page(filters, limit, offset)
    except UnknownFieldError as err:
        raise bad_request(f"q names unknown attribute {err.name!r}", "invalid_query") from None
    items = [merchant_resource(row) for row in rows]
    return json_response(ords_page(request, items, has_more, limit, offset))


async def create_merchant(request: web.Request) -> web.Response:
    require_token(request)
    body = await read_json(request)
    row = request.app[BOARDING_KEY].create(_fields(body, creating=True))
    return json_response(merchant_resource(row), status=201)


async def get_merchant(request: web.Request) -> web.Response:
    require_token(request)
    row = request.app[BOARDING_KEY].get(_merchant_id(request))
    return json_response(merchant_resource(row))


async def update_merchant(request: web.Request) -> web.Response:
    require_token(request)
    merchant_id = _merchant_id(request)
    body = await read_json(request)
    status = body.choice("merchant_status", API_STATUSES)
    fields = _fields(body, creating=False)
    if not fields and status is None:
        editable = ", ".join(("merchant_status", *EDITABLE_TEXT, *EDITABLE_INT))
        raise bad_request(f"nothing to update: send at least one of {editable}")
    row = request.app[BOARDING_KEY].update(merchant_id, fields, status)
    return json_response(merchant_resource(row))


async def force_status(request: web.Request) -> web.Response:
    """``POST /sim/merchants/{merchant_id}/status`` ``{merchant_status, trigger}``: any move."""
    merchant_id = _merchant_id(request)
    body = await read_json(request)
    allowed = (*(status.api_name for status in MerchantStatus), DELETED)
    status = body.choice("merchant_status", allowed, required=True)
    trigger = body.choice("trigger", TRIGGERS, default=MerchantTrigger.UI.value)
    deleted_by = body.text("deleted_by") or "partner-portal"
    if status is None:
        raise RuntimeError("no status")
    if trigger is None:
        raise RuntimeError("no trigger")
    row = request.app[BOARDING_KEY].force_status(
        merchant_id, status, MerchantTrigger(trigger), deleted_by
    )
    return json_response(merchant_resource(row))


async def _sweep(boarding: Boarding, clock: VirtualClock) -> None:
    """Expire unsigned applications when their 30 simulated days are up."""
    while True:
        boarding.changed.clear()
        boarding.expire_signatures()
        deadline = boarding.next_signature_deadline()
        timeout = None if deadline is None else clock.real_seconds(deadline - clock.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(boarding.changed.wait(), timeout)


def setup(app: web.Application, ctx: SimContext) -> None:
    webhooks = setup_webhooks(app, ctx)
    boarding = Boarding(ctx.store, ctx.clock, webhooks)
    app[BOARDING_KEY] = boarding
    app.router.add_get(MERCHANTS_PATH, list_merchants)
    app.router.add_post(MERCHANTS_PATH, create_merchant)
    app.router.add_get(MERCHANTS_PATH + "/{merchant_id}", get_merchant)
    app.router.add_put(MERCHANTS_PATH + "/{merchant_id}", update_merchant)
    app.router.add_post("/sim/merchants/{merchant_id}/status", force_status)
    sweeper = BackgroundTask(functools.partial(_sweep, boarding, ctx.clock), name="sim-sweep")

    async def start(_: web.Application) -> None:
        sweeper.start()

    async def stop(_: web.Application) -> None:
        await sweeper.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
