"""Vault payment accounts: create, get, update the fields sent, soft delete.

Every field of the record is a string except ``id`` (the interface's table); a deleted
account keeps its row with ``is_deleted`` ``"1"`` and reads back as 404.
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from kiosk_agent.sim import cards
from kiosk_agent.sim.context import SimContext
from kiosk_agent.sim.http import Body, bad_request, json_response, not_found
from kiosk_agent.sim.payments import merchant_call, merchant_of

REQUIRED_FIELDS = (
    "account_token", "name", "account_zip", "address1", "city", "region", "country", "email",
    "phone",
)  # fmt: skip
OPTIONAL_FIELDS = (
    "nickname", "address2", "expiration", "entry_class", "profile_id", "ach_acct_type_id",
    "vault_account_type_id", "is_default", *(f"custom_{n:02d}" for n in range(6, 11)),
)  # fmt: skip
UPDATABLE_FIELDS = frozenset((*REQUIRED_FIELDS, *OPTIONAL_FIELDS))
# Optional fields held as null until sent (the account type and the default flag have values).
_NULLABLE = tuple(
    name for name in OPTIONAL_FIELDS if name not in ("vault_account_type_id", "is_default")
)


class Vault:
    def __init__(self, ctx: SimContext) -> None:
        self._ctx = ctx
        self._accounts = ctx.store.documents("vault_accounts")

    def create(self, mid: str, fields: dict[str, Any]) -> dict[str, Any]:
        record_id = self._ctx.store.next_id("vault_account")
        now = self._ctx.clock.iso_now()
        token = str(fields["account_token"])
        is_ach = bool(fields.get("entry_class"))
        record: dict[str, Any] = {
            "id": record_id,
            "vaults_id": str(100000 + record_id),
            "uuid": str(uuid.uuid4()),
            "mid": mid,
            "account_token": token,
            "card_brand_id": str(cards.brand_of(token)),
            "vault_account_type_id": "3" if is_ach else "1",
            "last_four": cards.last_four_of(token),
            "is_deleted": "0",
            "is_default": "0",
            "updated": now,
            "updated_by": str(fields.get("created_by", "api")),
            "created": now,
            "created_by": str(fields.get("created_by", "api")),
            "product_id": "1",
            **{name: None for name in _NULLABLE},
            **{name: "" for name in REQUIRED_FIELDS if name != "account_token"},
        }
        record.update({k: v for k, v in fields.items() if k in UPDATABLE_FIELDS and v is not None})
        self._accounts.put(record["uuid"], record)
        return record

    def find(self, mid: str, account_uuid: str) -> dict[str, Any] | None:
        """An active account of ``mid``."""
        record = self._accounts.get(account_uuid)
        if record is None or record["mid"] != mid or record["is_deleted"] == "1":
            return None
        return record

    def get(self, mid: str, account_uuid: str) -> dict[str, Any]:
        record = self.find(mid, account_uuid)
        if record is None:
            raise not_found(f"no vault payment account {account_uuid!r}", "vault_account_not_found")
        return record

    def update(self, mid: str, account_uuid: str, changes: dict[str, Any]) -> dict[str, Any]:
        record = self.get(mid, account_uuid)
        record.update(changes)
        if "account_token" in changes:
            record["last_four"] = cards.last_four_of(record["account_token"])
            record["card_brand_id"] = str(cards.brand_of(record["account_token"]))
        record["updated"] = self._ctx.clock.iso_now()
        record["updated_by"] = "api"
        self._accounts.put(account_uuid, record)
        return record

    def delete(self, mid: str, account_uuid: str) -> dict[str, Any]:
        record = self.get(mid, account_uuid)
        record["is_deleted"] = "1"
        record["updated"] = self._ctx.clock.iso_now()
        self._accounts.put(account_uuid, record)
        return record


def _account_fields(body: Body, *, creating: bool) -> dict[str, Any]:
    unknown = set(body.data) - UPDATABLE_FIELDS - {"mid", "vault_holder_id"}
    if unknown:
        raise bad_request(f"unknown field {sorted(unknown)[0]!r} for a vault payment account")
    fields: dict[str, Any] = {}
    for name in REQUIRED_FIELDS:
        value = body.req_text(name) if creating else body.text(name)
        if value is not None:
            if not value.strip():
                raise bad_request(f"field {name!r} must not be empty")
            fields[name] = value
    for name in OPTIONAL_FIELDS:
        value = body.text(name)
        if value is not None:
            fields[name] = value
    if fields.get("is_default") not in (None, "0", "1"):
        raise bad_request(f"field 'is_default' must be '0' or '1', got {fields['is_default']!r}")
    return fields


async def handle_create(request: web.Request) -> web.Response:
    ctx, mid, body = await merchant_call(request)
    return json_response(ctx.vault.create(mid, _account_fields(body, creating=True)))


async def handle_get(request: web.Request) -> web.Response:
    ctx, mid = merchant_of(request)
    return json_response(ctx.vault.get(mid, request.match_info["uuid"]))


async def handle_update(request: web.Request) -> web.Response:
    ctx, mid, body = await merchant_call(request)
    changes = _account_fields(body, creating=False)
    return json_response(ctx.vault.update(mid, request.match_info["uuid"], changes))


async def handle_delete(request: web.Request) -> web.Response:
    ctx, mid = merchant_of(request)
    return json_response(ctx.vault.delete(mid, request.match_info["uuid"]))


def setup(app: web.Application, ctx: SimContext) -> None:
    ctx.vault = Vault(ctx)
    app.router.add_post("/api/v1/vault_payment_accounts", handle_create)
    app.router.add_get("/api/v1/vault_payment_accounts/{uuid}", handle_get)
    app.router.add_put("/api/v1/vault_payment_accounts/{uuid}", handle_update)
    app.router.add_delete("/api/v1/vault_payment_accounts/{uuid}", handle_delete)
