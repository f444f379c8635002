"""The terminal interface: eight simulated card readers and their asynchronous interactions.

A read-card or charge-card answers 202 at once; 1.5 simulated seconds later a card is
"presented" and the outcome is chosen by the amount's cents (cards.Outcome). An interaction
nobody finishes expires 3 simulated minutes after creation. Every change of an interaction is
stored, then handed to the listeners (the ActionCable endpoint) with the moment it happened,
so pushes go out with no polling in between.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kiosk_agent.sim import cards
from kiosk_agent.sim.auth import Credential
from kiosk_agent.sim.cards import Outcome
from kiosk_agent.sim.clock import iso_ms
from kiosk_agent.sim.context import SimContext, sim_context
from kiosk_agent.sim.http import (
    ApiError,
    bad_request,
    json_response,
    not_found,
    read_json,
)
from kiosk_agent.sim.payments import merchant, order_id_field

_LOGGER = logging.getLogger(__name__)

CARD_DELAY_S = 1.5  # simulated seconds until the card is presented
INTERACTION_LIFETIME_S = 180.0
PENDING = "pending"
FINAL_STATUSES = frozenset(("succeeded", "failed", "expired", "cancelled"))
KINDS = {"read-card": "read_card", "charge-card": "charge_card"}

# A listener gets the public record and the monotonic time of the change.
Listener = Callable[[dict[str, Any], float], None]


@dataclass(frozen=True, slots=True)
class Model:
    vendor: str
    model: str
    signature_capture: bool
    receipt_printing: bool


# One terminal per model, two vendors; SIM-0007 and SIM-0008 print (choices.md).
MODELS = {
    "SIM-0001": Model("Simtronic", "ST-100", True, False),
    "SIM-0002": Model("Simtronic", "ST-200", True, False),
    "SIM-0003": Model("Simtronic", "ST-300", True, False),
    "SIM-0004": Model("Simtronic", "ST-400", True, False),
    "SIM-0005": Model("Paylane", "PL-10", True, False),
    "SIM-0006": Model("Paylane", "PL-20", True, False),
    "SIM-0007": Model("Paylane", "PL-30P", False, True),
    "SIM-0008": Model("Paylane", "PL-40P", False, True),
}
_NAMES = {
    "SIM-0001": "Counter 1", "SIM-0002": "Counter 2", "SIM-0003": "Drive-through",
    "SIM-0004": "Kiosk A", "SIM-0005": "Kiosk B", "SIM-0006": "Vending 1",
    "SIM-0007": "Vending 2", "SIM-0008": "Ticket machine",
}  # fmt: skip


class Terminals:
    def __init__(self, ctx: SimContext) -> None:
        self._ctx = ctx
        self._states = ctx.store.documents("terminals")
        self._interactions = ctx.store.documents("interactions")
        self._timers: dict[str, list[asyncio.TimerHandle]] = {}
        self._busy: dict[str, str] = {}  # device_id -> pending interaction_id
        self._listeners: dict[str, set[Listener]] = {}
        for device_id in MODELS:
            if self._states.get(device_id) is None:
                self._states.put(
                    device_id, {"online": True, "connected": False, "last_seen_at": None}
                )

    # -- terminals -------------------------------------------------------------------------
    def describe(self, device_id: str) -> dict[str, Any]:
        model = self._model(device_id)
        state = self._state(device_id)
        return {
            "device_id": device_id,
            "name": _NAMES[device_id],
            "vendor": model.vendor,
            "model": model.model,
            "online": state["online"],
            "connected": state["connected"],
            "last_seen_at": state["last_seen_at"],
            "capabilities": {
                "signature_capture": model.signature_capture,
                "receipt_printing": model.receipt_printing,
            },
        }

    def all(self) -> list[dict[str, Any]]:
        return [self.describe(device_id) for device_id in MODELS]

    def _model(self, device_id: str) -> Model:
        model = MODELS.get(device_id)
        if model is None:
            raise not_found(f"no terminal {device_id!r}", "terminal_not_found")
        return model

    def _state(self, device_id: str) -> dict[str, Any]:
        state = self._states.get(device_id)
        if state is None:
            raise RuntimeError(f"unknown terminal {device_id}")
        return state

    def _touch(self, device_id: str, **changes: Any) -> dict[str, Any]:
        state = self._state(device_id)
        state.update(changes)
        if state["online"]:
            state["last_seen_at"] = self._ctx.clock.iso_now()
        self._states.put(device_id, state)
        return state

    def _require_online(self, device_id: str) -> None:
        self._model(device_id)
        if not self._state(device_id)["online"]:
            raise ApiError(409, "terminal_offline", f"terminal {device_id} is offline")

    def connect(self, device_id: str) -> dict[str, Any]:
        self._require_online(device_id)
        self._touch(device_id, connected=True)
        return {"device_id": device_id, "connected": True}

    def disconnect(self, device_id: str) -> dict[str, Any]:
        self._model(device_id)
        self._touch(device_id, connected=False)
        return {"device_id": device_id, "connected": False}

    def ping(self, device_id: str) -> dict[str, Any]:
        self._model(device_id)
        if not self._state(device_id)["online"]:
            return {"device_id": device_id, "online": False, "latency_ms": None}
        self._touch(device_id)
        latency_ms = self._ctx.rng.randint(20, 80)
        return {"device_id": device_id, "online": True, "latency_ms": latency_ms}

    def set_online(self, device_id: str, online: bool) -> dict[str, Any]:
        """Test helper: a terminal going offline fails its pending interaction."""
        self._model(device_id)
        self._touch(device_id, online=online, **({} if online else {"connected": False}))
        _LOGGER.debug("event: terminal %s %s", device_id, "online" if online else "offline")
        pending = self._busy.get(device_id)
        if not online and pending is not None:
            self._finish(
                pending, "failed", None,
                [_stage_error("card_read", "terminal_offline", "the terminal went offline")],
            )  # fmt: skip
        return {"device_id": device_id, "online": online}

    def print_receipt(self, device_id: str, mid: str, trans_id: str, copies: int) -> dict[str, Any]:
        model = self._model(device_id)
        if not model.receipt_printing:
            raise bad_request(
                f"terminal {device_id} cannot print receipts", "capability_unsupported"
            )
        self._require_online(device_id)
        self._ctx.payments.transaction(mid, trans_id)
        self._touch(device_id)
        return {"device_id": device_id, "trans_id": trans_id, "copies": copies, "printed": True}

    # -- interactions ----------------------------------------------------------------------
    def start(self, device_id: str, kind: str, mid: str, options: dict[str, Any]) -> dict[str, Any]:
        self._require_online(device_id)
        busy = self._busy.get(device_id)
        if busy is not None:
            raise ApiError(
                409, "terminal_busy", f"terminal {device_id} is running interaction {busy}"
            )
        now = self._ctx.clock.time()
        interaction_id = str(uuid.uuid4())
        record: dict[str, Any] = {
            "interaction_id": interaction_id,
            "device_id": device_id,
            "kind": kind,
            "status": PENDING,
            "created_at": iso_ms(now),
            "expires_at": iso_ms(now + INTERACTION_LIFETIME_S),
            "result": None,
            "stage_errors": [],
        }
        stored = {
            "record": record, "mid": mid, "options": options,
            "present_at": now + CARD_DELAY_S, "expire_at": now + INTERACTION_LIFETIME_S,
        }  # fmt: skip
        self._interactions.put(interaction_id, stored)
        self._touch(device_id, connected=True)  # a session is connected automatically
        self._schedule(stored)
        return record

    def _schedule(self, stored: dict[str, Any]) -> None:
        record = stored["record"]
        interaction_id = record["interaction_id"]
        self._busy[record["device_id"]] = interaction_id
        clock = self._ctx.clock
        self._timers[interaction_id] = [
            clock.call_at(stored["present_at"], self._present_card, interaction_id),
            clock.call_at(stored["expire_at"], self._expire, interaction_id),
        ]

    def hold_card(self, interaction_id: str) -> Callable[[], None]:
        """In-process tests: the customer waits with the card until the returned call presents
        it (a test that must act before the card comes, on a machine of any speed)."""
        self._timers[interaction_id][0].cancel()
        return lambda: self._present_card(interaction_id)

    def resume(self) -> None:
        """After a restart: pending interactions carry on from where virtual time stands."""
        for stored in self._interactions.all():
            if stored["record"]["status"] == PENDING:
                self._schedule(stored)

    def close(self) -> None:
        for handles in self._timers.values():
            for handle in handles:
                handle.cancel()
        self._timers.clear()

    def interaction(self, interaction_id: str, mids: tuple[str, ...]) -> dict[str, Any]:
        stored = self._interactions.get(interaction_id)
        if stored is None or stored["mid"] not in mids:
            raise not_found(f"no interaction {interaction_id!r}", "interaction_not_found")
        return stored

    def status(self, device_id: str, kind: str, interaction_id: str, mid: str) -> dict[str, Any]:
        self._model(device_id)
        stored = self.interaction(interaction_id, (mid,))
        record: dict[str, Any] = stored["record"]
        if record["device_id"] != device_id or record["kind"] != kind:
            raise not_found(
                f"no {kind} interaction {interaction_id!r} on {device_id}", "interaction_not_found"
            )
        return record

    def cancel(self, device_id: str, interaction_id: str, mid: str) -> dict[str, Any]:
        self._model(device_id)
        stored = self.interaction(interaction_id, (mid,))
        record = stored["record"]
        if record["device_id"] != device_id:
            raise not_found(
                f"no interaction {interaction_id!r} on {device_id}", "interaction_not_found"
            )
        if record["kind"] != "read_card" or record["status"] != PENDING:
            raise ApiError(
                409, "not_cancellable",
                f"only a pending read-card can be cancelled; this is a {record['status']} "
                f"{record['kind']}",
            )  # fmt: skip
        return self._finish(interaction_id, "cancelled", None, [])

    def _present_card(self, interaction_id: str) -> None:
        stored = self._interactions.get(interaction_id)
        if stored is None or stored["record"]["status"] != PENDING:
            return
        outcome = Outcome.for_cents(int(stored["options"]["amount"]))
        if outcome is Outcome.NO_CARD:
            return  # nobody taps: the expiry timer ends it
        if outcome is Outcome.DEVICE_FAULT:
            error = _stage_error("card_read", "device_fault", "the card reader stopped responding")
            self._finish(interaction_id, "failed", None, [error])
            return
        card = cards.presented_card(self._ctx.rng, self._ctx.clock.now().year)
        try:
            if stored["record"]["kind"] == "read_card":
                result: dict[str, Any] = {
                    "token": card.token,
                    "card_brand_id": card.card_brand_id,
                    "last_four": card.last_four,
                    "expiration": card.expiration,
                }
                self._finish(interaction_id, "succeeded", result, [])
            else:
                self._charge(stored, card)
        except Exception:  # a timer callback must never die silently
            _LOGGER.exception("Interaction %s failed inside the simulator", interaction_id)
            error = _stage_error("charge", "simulator_error", "the simulator failed; see its log")
            self._finish(interaction_id, "failed", None, [error])

    def _charge(self, stored: dict[str, Any], card: cards.SimCard) -> None:
        record = stored["record"]
        options = stored["options"]
        model = MODELS[record["device_id"]]
        errors = []
        if options.get("capture_signature") and not model.signature_capture:
            errors.append(_stage_error("signature", "capability_unsupported",
                                       "this terminal cannot capture signatures"))  # fmt: skip
        if options.get("print_receipt") and not model.receipt_printing:
            errors.append(_stage_error("receipt", "capability_unsupported",
                                       "this terminal cannot print receipts"))  # fmt: skip
        answer = self._ctx.payments.charge(
            stored["mid"],
            {
                "amount": options["amount"],
                "account_token": card.token,
                "expiration": card.expiration,
                "order_id": options.get("order_id"),
                "terminal_id": record["device_id"],
                "email": options.get("email"),
                "capture": "Y",
            },
        )
        self._finish(record["interaction_id"], "succeeded", answer, errors)

    def _expire(self, interaction_id: str) -> None:
        stored = self._interactions.get(interaction_id)
        if stored is not None and stored["record"]["status"] == PENDING:
            self._finish(interaction_id, "expired", None, [])

    def _finish(
        self, interaction_id: str, status: str, result: dict[str, Any] | None,
        stage_errors: list[dict[str, str]],
    ) -> dict[str, Any]:  # fmt: skip
        changed_at = time.monotonic()
        stored = self._interactions.get(interaction_id)
        if stored is None:
            raise RuntimeError(f"unknown interaction {interaction_id}")
        record = stored["record"]
        record.update(status=status, result=result, stage_errors=stage_errors)
        self._interactions.put(interaction_id, stored)
        _LOGGER.debug("event: %s %s on %s %s", record["kind"], interaction_id,
                      record["device_id"], status)  # `kiosk-agent sim -v`
        for handle in self._timers.pop(interaction_id, []):
            handle.cancel()
        if self._busy.get(record["device_id"]) == interaction_id:
            del self._busy[record["device_id"]]
        self._notify(record, changed_at)
        return dict(record)

    # -- listeners (ActionCable) -----------------------------------------------------------
    def subscribe(self, interaction_id: str, listener: Listener) -> Callable[[], None]:
        self._listeners.setdefault(interaction_id, set()).add(listener)

        def unsubscribe() -> None:
            listeners = self._listeners.get(interaction_id)
            if listeners is not None:
                listeners.discard(listener)
                if not listeners:
                    del self._listeners[interaction_id]

        return unsubscribe

    def _notify(self, record: dict[str, Any], changed_at: float) -> None:
        for listener in list(self._listeners.get(record["interaction_id"], ())):
            listener(dict(record), changed_at)


def _stage_error(stage: str, code: str, message: str) -> dict[str, str]:
    return {"stage": stage, "code": code, "message": message}


# -- handlers ------------------------------------------------------------------------------
def _caller(request: web.Request) -> tuple[SimContext, Credential, str]:
    """Authenticate, take one rate-limit token, resolve the merchant (all terminal calls)."""
    ctx = sim_context(request)
    credential = ctx.auth.authenticate(request)
    ctx.rate_limiter.check(credential.api_key)
    return ctx, credential, merchant(request, credential)


def _device(request: web.Request) -> str:
    return request.match_info["device_id"]


async def handle_list(request: web.Request) -> web.Response:
    ctx, _, _ = _caller(request)
    return json_response({"terminals": ctx.terminals.all()})


async def handle_connect(request: web.Request) -> web.Response:
    ctx, _, _ = _caller(request)
    return json_response(ctx.terminals.connect(_device(request)))


async def handle_disconnect(request: web.Request) -> web.Response:
    ctx, _, _ = _caller(request)
    return json_response(ctx.terminals.disconnect(_device(request)))


async def handle_ping(request: web.Request) -> web.Response:
    ctx, _, _ = _caller(request)
    return json_response(ctx.terminals.ping(_device(request)))


async def handle_start(request: web.Request) -> web.Response:
    ctx, _, mid = _caller(request)
    kind = KINDS[request.match_info["kind"]]
    body = await read_json(request)
    options: dict[str, Any] = {"amount": body.req_cents("amount")}
    if kind == "read_card":
        options["confirm_amount"] = body.flag("confirm_amount")
    else:
        options["order_id"] = order_id_field(body)
        options["capture_signature"] = body.flag("capture_signature")
        options["print_receipt"] = body.flag("print_receipt")
        options["email"] = body.text("email")
    record = ctx.terminals.start(_device(request), kind, mid, options)
    return json_response({"interaction_id": record["interaction_id"], "status": PENDING}, 202)


async def handle_status(request: web.Request) -> web.Response:
    ctx, _, mid = _caller(request)
    kind = KINDS[request.match_info["kind"]]
    interaction_id = request.match_info["interaction_id"]
    return json_response(ctx.terminals.status(_device(request), kind, interaction_id, mid))


async def handle_cancel(request: web.Request) -> web.Response:
    ctx, _, mid = _caller(request)
    interaction_id = request.match_info["interaction_id"]
    return json_response(ctx.terminals.cancel(_device(request), interaction_id, mid))


async def handle_print(request: web.Request) -> web.Response:
    ctx, _, mid = _caller(request)
    body = await read_json(request)
    trans_id = body.req_text("trans_id")
    copies = body.integer("copies", minimum=1, maximum=5) or 1
    return json_response(ctx.terminals.print_receipt(_device(request), mid, trans_id, copies))


async def handle_ws_token(request: web.Request) -> web.Response:
    ctx, credential, _ = _caller(request)
    token, expires_at = ctx.auth.issue_ws_token(credential)
    return json_response({"token": token, "expires_at": expires_at})


async def handle_set_online(request: web.Request) -> web.Response:
    """Test helper ``POST /sim/terminals/{device_id}/offline|online`` (no auth)."""
    ctx = sim_context(request)
    online = request.match_info["state"] == "online"
    return json_response(ctx.terminals.set_online(_device(request), online))


def setup(app: web.Application, ctx: SimContext) -> None:
    ctx.terminals = Terminals(ctx)
    ctx.terminals.resume()

    async def close(_: web.Application) -> None:
        ctx.terminals.close()

    app.on_cleanup.append(close)
    router = app.router
    router.add_post("/api/ws-token", handle_ws_token)
    router.add_get("/api/terminal", handle_list)
    router.add_post("/api/terminal/{device_id}/connect", handle_connect)
    router.add_delete("/api/terminal/{device_id}/disconnect", handle_disconnect)
    router.add_post("/api/terminal/{device_id}/ping", handle_ping)
    router.add_post("/api/terminal/{device_id}/{kind:read-card|charge-card}", handle_start)
    router.add_get(
        "/api/terminal/{device_id}/{kind:read-card|charge-card}/{interaction_id}", handle_status
    )
    router.add_delete("/api/terminal/{device_id}/cancel/{interaction_id}", handle_cancel)
    router.add_post("/api/terminal/{device_id}/print-receipt", handle_print)
    router.add_post("/sim/terminals/{device_id}/{state:offline|online}", handle_set_online)
