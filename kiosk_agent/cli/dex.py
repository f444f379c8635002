"""``kiosk-agent dex``: the machine's own audit (EVA-DTS), read over its DEX port or from a file.

    kiosk-agent dex read [-c FILE] [--port P] [--protocol dex_ucs|ddcmp] [--save FILE]
                                                              one read now (the config's dex.port)
    kiosk-agent dex parse FILE                                a saved audit

Both print what the audit states (the machine, its totals since initialisation and since the
last reset, cash and cashless), ``--json`` as one document, ``--format csv|json`` its columns
through the one export (``kiosk_agent.export``). A file that is no audit says the line and the
field (exit 2); a read that fails says why (exit 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kiosk_agent.cli import contract
from kiosk_agent.cli.contract import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError

if TYPE_CHECKING:
    from kiosk_agent.audit.evadts import AuditFile, Counters
    from kiosk_agent.audit.link import LinkRead
    from kiosk_agent.audit.link_settings import LinkSettings

MAX_FILE = 16 << 20  # a real audit is kilobytes; a file past this is no audit
# audit.link_settings.LinkProtocol's values, named here so that `--help` imports nothing more
PROTOCOLS = ["dex_ucs", "ddcmp"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dex",
        help="the machine's own audit (EVA-DTS): read it over DEX, or parse a saved one",
        description="Read the vending machine's audit over its DEX port (DEX/UCS or DDCMP), or "
        "parse a "
        "saved EVA-DTS file: the machine, its sales since initialisation and since the last "
        "reset, cash and cashless, and its columns (--format csv).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    read = actions.add_parser(
        "read",
        parents=contract.options(),
        help="read the audit now, from the config's dex.port or --port",
        description="One read of the machine's audit over its DEX port. The port is the "
        "configuration's dex.port, or --port (a device, a /dev/serial/by-id link, or "
        "socket://HOST:PORT).",
    )
    read.add_argument("--port", help="the DEX port (default: the configuration's dex.port)")
    read.add_argument(
        "--protocol", choices=PROTOCOLS,
        help="the link protocol: dex_ucs (DEX/UCS) or ddcmp (default: the config's, or dex_ucs)",
    )  # fmt: skip
    read.add_argument("--save", type=Path, metavar="FILE", help="keep the audit as read in FILE")
    _format_option(read)
    read.set_defaults(handler=contract.guarded(_read), leaf_parser=read)
    parse = actions.add_parser(
        "parse",
        parents=contract.options(config=False),
        help="parse a saved EVA-DTS audit file",
        description="Parse a saved EVA-DTS audit file (CR LF or LF line ends): its envelope "
        "and G85 check are verified; a file that is no audit names the line and field.",
    )
    parse.add_argument("file", type=Path, metavar="FILE", help="the audit file")
    _format_option(parse)
    parse.set_defaults(handler=contract.guarded(_parse), leaf_parser=parse)


def _format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=["csv", "json"],
        help="print the audit's columns (products) as CSV or a JSON array instead",
    )


async def _parse(args: argparse.Namespace) -> int:
    from kiosk_agent.audit.evadts import AuditError, parse_audit

    path: Path = args.file
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE + 1)
    except OSError as err:
        raise CliError(f"cannot read {path}: {err.strerror or err}", EXIT_USAGE) from None
    if len(data) > MAX_FILE:
        raise CliError(f"{path} is over {MAX_FILE >> 20} MiB: no audit is", EXIT_USAGE)
    try:
        audit = parse_audit(data)
    except AuditError as err:
        raise CliError(f"{path}: {err}", EXIT_USAGE) from None
    _print(args, audit)
    return EXIT_OK


async def _read(args: argparse.Namespace) -> int:
    from kiosk_agent.audit.evadts import AuditError, parse_audit
    from kiosk_agent.audit.link import LinkError, read_link

    settings = _link_settings(args)
    contract.STATUS.show(f"reading the audit on {settings.port} ...")
    try:
        read = await read_link(settings)
    except LinkError as err:
        raise CliError(f"no audit from {settings.port}: {err}", EXIT_FAILED) from None
    if args.save is not None:
        _save(args.save, read.audit)
    try:
        audit = parse_audit(read.audit)
    except AuditError as err:
        raise CliError(f"the machine's audit is malformed: {err}", EXIT_FAILED) from None
    _print(args, audit, read)
    return EXIT_OK


def _link_settings(args: argparse.Namespace) -> LinkSettings:
    from kiosk_agent.audit.link_settings import LinkProtocol, LinkSettings
    from kiosk_agent.audit.schema import link_settings

    path = contract.optional_config_path(args) if args.port else contract.config_path(args)
    section = contract.load(path).get("dex") if path is not None else None
    if section is None and not args.port:
        raise CliError(f"{path} has no dex: section; give --port", EXIT_USAGE)
    settings = link_settings(section, port=args.port) if section else LinkSettings(args.port)
    if settings.port.startswith("virtual:"):  # audit.component.VIRTUAL_PORT
        raise CliError(
            f"{settings.port} is the DEX port of the virtual machine the agent (or the demo) runs "
            f"in its own process: no other command can open it; `kiosk-agent audit -c {path}` "
            "shows what the agent read, or give --port", EXIT_USAGE,
        )  # fmt: skip
    if args.protocol:
        from dataclasses import replace

        settings = replace(settings, protocol=LinkProtocol(args.protocol))
    return settings


def _save(path: Path, audit: bytes) -> None:
    try:
        path.write_bytes(audit)
    except OSError as err:
        raise CliError(f"cannot save the audit in {path}: {err.strerror or err}") from None


def _print(args: argparse.Namespace, audit: AuditFile, read: LinkRead | None = None) -> None:
    if args.format:
        from kiosk_agent.export import export_audit_products

        contract.STATUS.clear()
        for piece in export_audit_products(audit, args.format):
            sys.stdout.write(piece)
        return
    if contract.wants_json(args):
        contract.print_json(summary(audit, read))
        return
    contract.show(args, _lines(audit, read))


def summary(audit: AuditFile, read: LinkRead | None = None) -> dict[str, object]:
    """The audit as ``--json`` prints it: amounts as ``"2.50"`` strings, counts as numbers."""
    from kiosk_agent.money import cents_to_dollars

    def tally(value: Counters | None) -> dict[str, object] | None:
        if value is None:
            return None
        init, reset = value.since_init, value.since_reset
        return {
            "value_since_init": None if init is None else cents_to_dollars(init.value),
            "count_since_init": None if init is None else init.count,
            "value_since_reset": None if reset is None else cents_to_dollars(reset.value),
            "count_since_reset": None if reset is None else reset.count,
        }

    machine = audit.machine
    result: dict[str, object] = {
        "sender": audit.sender,
        "machine_serial": machine.serial if machine else None,
        "machine_model": machine.model if machine else None,
        "read_at": audit.read_at.isoformat() if audit.read_at else None,  # the machine's clock
        "currency": audit.currency or None,
        "decimal_places": audit.decimal_places,
        "check": audit.check,
        "paid_vends": tally(audit.paid_vends),
        "test_vends": tally(audit.test_vends),
        "free_vends": tally(audit.free_vends),
        "cash_sales": tally(audit.cash_sales),
        "cashless": {device: tally(sales) for device, sales in audit.cashless.items()},
        "products": len(audit.products),
        "other_blocks": len(audit.other),
        "notes": list(audit.notes),
    }
    if read is not None:
        result["link"] = {
            "protocol": read.protocol.value,
            "machine_id": read.machine_id,
            "blocks": read.blocks,
            "blocks_sent_again": read.refused_blocks,
            "bytes": read.bytes_heard,
            "seconds": round(read.seconds, 3),
        }
    return result


def _lines(audit: AuditFile, read: LinkRead | None) -> list[tuple[str, object]]:
    currency = audit.currency
    machine = audit.machine
    identity = " ".join(part for part in (machine.serial, machine.model) if part) if machine else ""
    lines: list[tuple[str, object]] = [
        ("machine", f"{audit.sender} {identity}".strip()),
        ("read at", audit.read_at.strftime("%Y-%m-%d %H:%M (its own clock)") if audit.read_at
         else None),
        ("check", f"G85 {audit.check} verified" if audit.check else "no G85 sent"),
        ("paid vends", _tally_text(audit.paid_vends, currency)),
        ("cash", _tally_text(audit.cash_sales, currency)),
    ]  # fmt: skip
    lines += [(f"cashless {device}", _tally_text(sales, currency))
              for device, sales in audit.cashless.items()]  # fmt: skip
    lines += [
        ("free vends", _tally_text(audit.free_vends, currency)),
        ("test vends", _tally_text(audit.test_vends, currency)),
        ("products", f"{len(audit.products)} (--format csv lists them)"),
    ]
    lines += [("note", note) for note in audit.notes]
    if read is not None:
        lines.append(
            ("link", f"{read.blocks} blocks ({read.refused_blocks} sent again), "
             f"{read.bytes_heard} bytes in {read.seconds:.1f} s from {read.machine_id} "
             f"({read.protocol.value})")
        )  # fmt: skip
    return lines


def _tally_text(tally: Counters | None, currency: str) -> str | None:
    """``"1,435.00 EUR in 423 since initialisation; 1,424.50 EUR in 421 since the reset"``."""
    from kiosk_agent.money import cents_to_dollars, format_cents

    if tally is None:
        return None
    parts = []
    for value, count, since in (
        (tally.value_since_init, tally.count_since_init, "since initialisation"),
        (tally.value_since_reset, tally.count_since_reset, "since the reset"),
    ):
        if value is None and count is None:
            continue
        if value is None:
            money = "-"
        else:  # a file that names no currency gets none named
            money = format_cents(value, currency) if currency else cents_to_dollars(value)
        parts.append(f"{money} in {'-' if count is None else f'{count:,}'} {since}")
    return "; ".join(parts) or None
