"""`kiosk-agent payments|vault|plans|hpp|keys`: one payment, a stored card, a plan, a page, the key.

Amounts on the command line are dollar strings converted exactly to cents; a card's account
token is read from standard input with ``--token -`` so it stays out of shell history.
"""

from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from typing import Any

from kiosk_agent.cli.contract import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    as_text,
    given,
    guarded,
    options,
    parse_amount,
    parse_moment,
    positive_int,
    print_json,
    print_record,
    safe_dump,
    say,
    show,
    validated,
    wants_json,
)
from kiosk_agent.cli.service_access import service_client
from kiosk_agent.export import Amount as Money  # integer cents: $2.50 for people, "2.50" in JSON
from kiosk_agent.moments import timestamp
from kiosk_agent.money import dollars_to_cents, format_cents

SERVICE = options(timeout=True)


def register(subparsers: Any) -> None:
    for add in (_register_payments, _register_vault, _register_plans, _register_hpp,
                _register_keys):
        add(subparsers)


def _register_payments(subparsers: Any) -> None:
    parser = subparsers.add_parser("payments", parents=SERVICE, help="charge, capture, void ...")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    charge = actions.add_parser("charge", parents=SERVICE, help="charge a token or vaulted card")
    charge.add_argument("--amount", required=True, help='dollars, e.g. "2.50"')
    source = charge.add_mutually_exclusive_group(required=True)
    source.add_argument("--token", help="account token, or - to read it from stdin")
    source.add_argument("--vault-uuid", help="a vaulted payment account (stored credential)")
    charge.add_argument("--expiration", help="MMYY (with --token)")
    charge.add_argument("--order-id", help="your order id (made on the device when omitted)")
    charge.add_argument("--auth-only", action="store_true", help="authorize; capture later")
    charge.add_argument("--cof", choices=["C", "M"], help="stored credential: C customer present, "
                        "M merchant-initiated (default with --vault-uuid: M)")
    charge.add_argument("--scheduled", action="store_true", help="stored credential: recurring")
    charge.set_defaults(handler=guarded(payments_charge))

    for name, text in (("capture", "capture an authorization"),
                       ("void", "void, or refund when settled")):
        sub = actions.add_parser(name, parents=SERVICE, help=text)
        sub.add_argument("trans_id", metavar="TRANS_ID")
        sub.add_argument("--amount", help="dollars; default: the whole amount")
        sub.set_defaults(handler=guarded(payments_capture if name == "capture" else payments_void))

    surcharge = actions.add_parser("surcharge", parents=SERVICE, help="would a card pay a fee")
    surcharge.add_argument("--amount", required=True)
    card = surcharge.add_mutually_exclusive_group(required=True)
    card.add_argument("--token", help="account token, or - to read it from stdin")
    card.add_argument("--bin", help="the card's first six digits")
    surcharge.set_defaults(handler=guarded(payments_surcharge))

    receipt = actions.add_parser("receipt", parents=SERVICE, help="e-mail a receipt")
    receipt.add_argument("trans_id", metavar="TRANS_ID")
    receipt.add_argument("--email", required=True)
    receipt.set_defaults(handler=guarded(payments_receipt))


def _token(value: str) -> str:
    """A token given as ``-`` is read from stdin, so it stays out of shell history."""
    token = sys.stdin.readline().strip() if value == "-" else value.strip()
    if not token:
        raise CliError("--token: empty token", EXIT_USAGE)
    return token


def _charge_lines(result: Any) -> list[tuple[str, object]]:
    verdict = {"A": "approved", "B": "retry", "C": "declined"}.get(str(result.result), "unknown")
    amount = Money(result.amount, result.currency) if result.amount is not None else None
    return [
        ("result", f"{result.result} ({verdict})"), ("trans_id", result.trans_id),
        ("order_id", result.order_id), ("amount", amount), ("auth_code", result.auth_code),
        ("resp_text", result.resp_text), ("payment_account_uuid", result.payment_account_uuid),
    ]


async def payments_charge(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.payments import ChargeRequest

    cents = parse_amount(args.amount)
    if args.token is not None and not args.expiration:
        # the service refuses a token charge without it: say so before anything is sent
        raise CliError(
            "payments charge --token needs --expiration MMYY (the card's expiry, e.g. 1230)",
            EXIT_USAGE,
        )
    async with service_client(args) as svc:
        fields: dict[str, Any] = {
            "mid": svc.settings.mid, "amount": cents, "capture": not args.auth_only,
            "order_id": args.order_id,
        }
        if args.token is not None:
            fields.update(account_token=_token(args.token), expiration=args.expiration)
        else:
            fields.update(payment_account_uuid=args.vault_uuid, cof=args.cof or "M",
                          cof_sched=args.scheduled)
        result = await svc.payments.charge(validated(ChargeRequest, "charge", fields))
    show(args, _charge_lines(result))
    return EXIT_OK if result.approved else EXIT_FAILED


async def payments_capture(args: argparse.Namespace) -> int:
    cents = parse_amount(args.amount) if args.amount else None
    async with service_client(args) as svc:
        result = await svc.payments.capture(args.trans_id, cents)
    show(args, _charge_lines(result))
    return EXIT_OK if result.approved else EXIT_FAILED


async def payments_void(args: argparse.Namespace) -> int:
    cents = parse_amount(args.amount) if args.amount else None
    async with service_client(args) as svc:
        result = await svc.payments.void_or_refund(args.trans_id, cents)
    outcome = "voided" if result.voided else "refunded" if result.refunded else result.resp_text
    show(args, [
        ("outcome", outcome), ("trans_id", result.trans_id), ("order_id", result.order_id),
        ("amount", Money(result.amount, result.currency)), ("resp_text", result.resp_text),
    ])
    return EXIT_OK


async def payments_surcharge(args: argparse.Namespace) -> int:
    cents = parse_amount(args.amount)
    async with service_client(args) as svc:
        if args.token is not None:
            result = await svc.payments.surcharge(cents, account_token=_token(args.token))
        else:
            result = await svc.payments.surcharge(cents, card_bin=args.bin)
    show(args, [
        ("surcharge", result.surcharge), ("surcharge_amount", Money(result.surcharge_amount)),
        ("surcharge_percent", result.surcharge_percent),
    ])
    return EXIT_OK


async def payments_receipt(args: argparse.Namespace) -> int:
    async with service_client(args) as svc:
        result = await svc.payments.send_receipt(args.trans_id, args.email)
    say(args, "receipt sent" if result.sent else "the service did not send the receipt",
        trans_id=args.trans_id, sent=result.sent)
    return EXIT_OK if result.sent else EXIT_FAILED


VAULT_FIELDS = ("name", "account_zip", "address1", "address2", "city", "region", "country",
                "email", "phone", "nickname", "expiration")


def _register_vault(subparsers: Any) -> None:
    parser = subparsers.add_parser("vault", parents=SERVICE, help="stored payment accounts")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=SERVICE, help="vault an account token")
    create.add_argument("--token", required=True, help="account token, or - to read from stdin")
    update = actions.add_parser("update", parents=SERVICE, help="change fields of an account")
    update.add_argument("uuid", metavar="UUID")
    for sub, required in ((create, True), (update, False)):
        for field in VAULT_FIELDS:
            needed = required and field not in ("address2", "nickname", "expiration")
            sub.add_argument(f"--{field.replace('_', '-')}", dest=field, required=needed)
    create.set_defaults(handler=guarded(vault_create))
    update.set_defaults(handler=guarded(vault_update))
    for name, handler in (("get", vault_get), ("delete", vault_delete)):
        sub = actions.add_parser(name, parents=SERVICE, help=f"{name} an account")
        sub.add_argument("uuid", metavar="UUID")
        sub.set_defaults(handler=guarded(handler))


def _vault_lines(account: Any) -> list[tuple[str, object]]:
    return [(k, v) for k, v in safe_dump(account).items() if v is not None]


async def vault_create(args: argparse.Namespace) -> int:
    from kiosk_agent.service.models.vault import VaultAccountRequest

    request = VaultAccountRequest(account_token=_token(args.token), **given(args, VAULT_FIELDS))
    async with service_client(args) as svc:
        account = await svc.vault.create(request)
    show(args, _vault_lines(account))
    return EXIT_OK


async def vault_get(args: argparse.Namespace) -> int:
    async with service_client(args) as svc:
        account = await svc.vault.get(args.uuid)
    show(args, _vault_lines(account))
    return EXIT_OK


async def vault_update(args: argparse.Namespace) -> int:
    changes = given(args, VAULT_FIELDS)
    if not changes:
        raise CliError("nothing to update: give at least one field such as --email", EXIT_USAGE)
    async with service_client(args) as svc:
        account = await svc.vault.update(args.uuid, **changes)
    show(args, _vault_lines(account))
    return EXIT_OK


async def vault_delete(args: argparse.Namespace) -> int:
    async with service_client(args) as svc:
        await svc.vault.delete(args.uuid)
    say(args, f"deleted vault payment account {args.uuid}", uuid=args.uuid, deleted=True)
    return EXIT_OK


def _register_plans(subparsers: Any) -> None:
    parser = subparsers.add_parser("plans", parents=SERVICE, help="recurring billing plans")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=SERVICE, help="bill a vaulted card on a rule")
    create.add_argument("--name", required=True)
    create.add_argument("--description", default="")
    create.add_argument("--vault-uuid", required=True, help="the vaulted payment account")
    create.add_argument("--amount", required=True, help='dollars per payment, e.g. "9.99"')
    create.add_argument("--start", required=True, help="first payment, e.g. 2026-12-01")
    create.add_argument("--every", default="MONTHLY",
                        choices=["DAILY", "WEEKLY", "MONTHLY", "YEARLY"])
    create.add_argument("--interval", type=positive_int, default=1)
    create.add_argument("--until", help="last day (inclusive); none: open-ended")
    create.set_defaults(handler=guarded(plans_create))
    for name, handler in (("get", plans_get), ("cancel", plans_cancel)):
        sub = actions.add_parser(name, parents=SERVICE, help=f"{name} a plan")
        sub.add_argument("plan_id", metavar="PLAN_ID", type=positive_int)
        sub.set_defaults(handler=guarded(handler))


async def plans_create(args: argparse.Namespace) -> int:
    from kiosk_agent.money import cents_to_decimal
    from kiosk_agent.service.rrule import build_rrule

    start = parse_moment(args.start, end=False)
    until = parse_moment(args.until, end=False) if args.until else None
    if start is None:
        raise RuntimeError("--start named no moment")
    rule = build_rrule(start, args.every, args.interval,
                       until.date() if until and len(args.until) == 10 else until)
    amount = cents_to_decimal(parse_amount(args.amount))
    async with service_client(args) as svc:
        plan_id = await svc.plans.create(
            name=args.name, description=args.description, payment_account_uuid=args.vault_uuid,
            amount=amount, rrule_pattern=rule,
        )
        plan = await svc.plans.get(plan_id)
    _print_plan(plan, args)
    return EXIT_OK


def _print_plan(plan: Any, args: argparse.Namespace) -> None:
    if wants_json(args):
        print_json(safe_dump(plan))
        return
    print_record(
        [("id", plan.id), ("name", plan.name), ("status", plan.status),
         ("amount", Money(dollars_to_cents(plan.amount))),  # $9.99, as every amount is shown
         ("rule", plan.rrule_pattern.replace("\n", " ")),
         ("payments", len(plan.scheduled_payments))],
        as_json=False, out=sys.stdout,
    )
    for payment in plan.scheduled_payments:
        scheduled = format_cents(dollars_to_cents(payment.amount_scheduled))
        print(f"  #{payment.payment_number:<3} {as_text(payment.payment_date)}  "
              f"{scheduled:>10}  {payment.payment_status}")


async def plans_get(args: argparse.Namespace) -> int:
    async with service_client(args) as svc:
        plan = await svc.plans.get(args.plan_id)
    _print_plan(plan, args)
    return EXIT_OK


async def plans_cancel(args: argparse.Namespace) -> int:
    async with service_client(args) as svc:
        await svc.plans.cancel(args.plan_id)
        plan = await svc.plans.get(args.plan_id)
    _print_plan(plan, args)
    return EXIT_OK


def _register_hpp(subparsers: Any) -> None:
    parser = subparsers.add_parser("hpp", parents=SERVICE, help="hosted payment pages")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", parents=SERVICE, help="make a page; prints its link")
    edit = actions.add_parser("edit", parents=SERVICE, help="change a page (others keep value)")
    edit.add_argument("page", metavar="PAGE", help="the page's id or its link")
    for sub in (create, edit):
        sub.add_argument("--name", required=sub is create)
        sub.add_argument("--amount", help='dollars, e.g. "25.00"')
        sub.add_argument("--min-amount", help="with an unlocked amount: the least a payer may pay")
        sub.add_argument("--max-amount", help="with an unlocked amount: the most a payer may pay")
        lock = sub.add_mutually_exclusive_group()
        lock.add_argument("--lock-amount", dest="lock_amount", action="store_true", default=None)
        lock.add_argument("--unlock-amount", dest="lock_amount", action="store_false")
    create.set_defaults(handler=guarded(hpp_create))
    edit.set_defaults(handler=guarded(hpp_edit))


def _page(args: argparse.Namespace) -> Any:
    from kiosk_agent.money import cents_to_decimal
    from kiosk_agent.service.models.hpp import HostedPage

    def dollars(text: str | None) -> Decimal | None:
        return cents_to_decimal(parse_amount(text)) if text else None

    return validated(HostedPage, "page", {
        "name": args.name, "amount": dollars(args.amount), "lock_amount": args.lock_amount,
        "min_amount": dollars(args.min_amount), "max_amount": dollars(args.max_amount),
    })


async def hpp_create(args: argparse.Namespace) -> int:
    page = _page(args)
    async with service_client(args) as svc:
        link = await svc.hpp.create(page)
    show(args, [("url", link.url), ("page_id", link.hpp_client_id)])
    return EXIT_OK


async def hpp_edit(args: argparse.Namespace) -> int:
    changes = _page(args)
    if not changes.to_wire():
        raise CliError("nothing to change: give --name, --amount ...", EXIT_USAGE)
    async with service_client(args) as svc:
        await svc.hpp.edit(args.page, changes)
    say(args, f"updated hosted page {args.page}", page=args.page, updated=True)
    return EXIT_OK


def _register_keys(subparsers: Any) -> None:
    parser = subparsers.add_parser("keys", parents=SERVICE, help="the payments API key")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("refresh", parents=SERVICE, help="rotate the key now").set_defaults(
        handler=guarded(keys_refresh)
    )


async def keys_refresh(args: argparse.Namespace) -> int:
    async with service_client(args) as svc:
        settings = svc.settings
        if settings.credentials_path is None:
            # The refresh spends the refresh token: a new pair that is not saved is a locked door.
            raise CliError(
                "refusing to rotate: no credentials_path is set, so the new key would be lost. "
                "Set KIOSK_CREDENTIALS_PATH (or service.credentials_path) to the agent's "
                "credentials file",
                EXIT_USAGE,
            )
        credentials = await svc.keys.refresh()
    expires = credentials.api_key_expires_at
    until = timestamp(expires) if expires else None  # ISO 8601 UTC, as every JSON time
    say(args, f"rotated: the new key is saved in {settings.credentials_path} "
        f"(expires {until or 'unknown'})",
        rotated=True, credentials_path=str(settings.credentials_path), expires_at=until)
    return EXIT_OK
