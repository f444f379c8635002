"""`kiosk-agent boarding merchants|merchant|create|update`: merchants and their onboarding.

``merchants --webhooks`` reads this unit's webhook receiver's store instead of the service.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    config_path,
    guarded,
    load,
    options,
    positive_int,
    safe_dump,
    show,
    validated,
)
from kiosk_agent.cli.report import add_list_options, write_records
from kiosk_agent.cli.service_access import service_client

if TYPE_CHECKING:
    from pathlib import Path

    from kiosk_agent.service.models.boarding import MerchantStatus

SERVICE = options(timeout=True)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("boarding", parents=SERVICE, help="merchants and onboarding")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    merchants = actions.add_parser("merchants", parents=SERVICE, help="list merchants")
    add_list_options(merchants)
    merchants.add_argument("--status", help="new, sent_for_signature, boarded, live ...")
    merchants.add_argument("--mid")
    merchants.add_argument("--dba-name")
    merchants.add_argument(
        "--webhooks",
        action="store_true",
        help="the state this unit's webhook receiver keeps (its store), not the service's list",
    )
    merchants.set_defaults(handler=guarded(boarding_merchants))

    merchant = actions.add_parser("merchant", parents=SERVICE, help="one merchant")
    merchant.add_argument("merchant_id", metavar="MERCHANT_ID", type=positive_int)
    merchant.set_defaults(handler=guarded(boarding_merchant))

    create = actions.add_parser("create", parents=SERVICE, help="start a merchant application")
    create.add_argument("--dba-name", required=True)
    create.add_argument("--legal-name")
    create.add_argument("--external-crm-id")
    create.set_defaults(handler=guarded(boarding_create))

    update = actions.add_parser("update", parents=SERVICE, help="change a merchant")
    update.add_argument("merchant_id", metavar="MERCHANT_ID", type=positive_int)
    update.add_argument("--status", help="sent_for_signature (send or resend) or new (retract)")
    update.add_argument("--dba-name")
    update.add_argument("--legal-name")
    update.add_argument("--external-crm-id")
    update.set_defaults(handler=guarded(boarding_update))


def _merchant_lines(merchant: Any) -> list[tuple[str, object]]:
    status = merchant.status.api_name if merchant.status else merchant.merchant_status_id
    lines: list[tuple[str, object]] = [("status", status)]
    lines += [(k, v) for k, v in safe_dump(merchant).items() if v is not None]
    return lines


def merchant_status_arg(text: str | None) -> MerchantStatus | int | None:
    """``--status`` by name (``sent_for_signature``) or id; a typo is shown to its typist."""
    from kiosk_agent.service.models.boarding import MerchantStatus

    if text is None:
        return None
    if text.strip().isdigit():
        return int(text)
    try:
        return MerchantStatus.from_name(text)
    except ValueError as err:
        raise CliError(f"--status: {err}", EXIT_USAGE) from None


async def boarding_merchants(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.boarding import MerchantFilter

    if args.webhooks:
        return await webhook_merchant_states(args)
    status = merchant_status_arg(args.status)
    filters = validated(MerchantFilter, "--status",
                        {"mid": args.mid, "dba_name": args.dba_name, "merchant_status_id": status})
    async with service_client(args, needs="oauth") as svc:
        records = svc.boarding.merchants(filters, page_size=args.page_size, limit=args.limit)
        return await write_records(records, args, "merchants")


async def webhook_merchant_states(args: argparse.Namespace) -> int:
    """Each merchant's latest state as the receiver's durable store has it (any arrival order)."""
    rows = stored_merchant_states(config_path(args))

    async def records() -> AsyncIterator[Any]:
        for row in rows:
            yield row

    return await write_records(records(), args, "merchant_states")


def stored_merchant_states(path: Path) -> list[Any]:
    import sqlite3
    from pathlib import Path

    from kiosk_agent.admin.webhooks import read_merchant_states

    config = load(path, check_platforms=False)
    if "webhooks" not in config.data:
        raise CliError(f"{path}: no webhooks: section, so this unit receives none", EXIT_USAGE)
    store = Path(config.resolve(config["webhooks"]["store"]))  # validated, defaults filled
    if not store.is_file():
        raise CliError(f"no webhook store at {store}: the receiver has accepted no event yet")
    try:
        return read_merchant_states(store)
    except sqlite3.Error as err:
        raise CliError(f"cannot read the webhook store {store}: {err}") from None


async def boarding_merchant(args: argparse.Namespace) -> int:
    async with service_client(args, needs="oauth") as svc:
        merchant = await svc.boarding.get(args.merchant_id)
    show(args, _merchant_lines(merchant))
    return EXIT_OK


async def boarding_create(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.boarding import MerchantCreate

    request = MerchantCreate(dba_name=args.dba_name, legal_name=args.legal_name,
                             external_crm_id=args.external_crm_id)
    async with service_client(args, needs="oauth") as svc:
        merchant = await svc.boarding.create(request)
    show(args, _merchant_lines(merchant))
    return EXIT_OK


async def boarding_update(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.boarding import MerchantUpdate

    status = merchant_status_arg(args.status)
    changes = validated(MerchantUpdate, "--status", {
        "merchant_status": status, "dba_name": args.dba_name, "legal_name": args.legal_name,
        "external_crm_id": args.external_crm_id,
    })
    if not changes.to_wire():
        raise CliError("nothing to update: give --status or a field", EXIT_USAGE)
    async with service_client(args, needs="oauth") as svc:
        merchant = await svc.boarding.update(args.merchant_id, changes)
    show(args, _merchant_lines(merchant))
    return EXIT_OK
