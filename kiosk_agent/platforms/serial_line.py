"""Any line-based serial device, described in the configuration instead of in code.

Regular expressions map the lines the device sends to events, templates give the lines the agent
answers with::

    - platform: serial_line
      name: locker
      port: /dev/serial/by-id/usb-FTDI_FT232R-if00-port0
      init: ["HELLO"]                                   # each (re)connect, after any dispense
      vend_request: '^REQ (?P<product>\\w+) (?P<price>\\d+\\.\\d\\d)$'
      dispense_ok: '^DONE'
      dispense_failed: '^FAIL (?P<reason>.*)$'
      cancel: '^ABORT'                                  # optional
      approve: 'OPEN {product}'
      deny: 'NO {reason}'
      out_of_service: 'CARD OFF {reason}'               # optional, sent when cards stop working
      in_service: 'CARD ON'                             # optional, sent when they work again

``vend_request`` must have a ``price`` group (``price_unit``: dollars like ``2.50``, or cents);
``product`` is optional. Templates may use ``{product}``, ``{price}`` (as the device wrote it),
``{cents}``, ``{amount}`` (two-place dollars) and, in ``deny`` and ``out_of_service``,
``{reason}``.

Out of service (``health.availability``): while the terminal cannot take cards a vend request starts
no sale and is answered at once with ``deny`` whose ``{reason}`` is short
(``out of service: terminal offline``); ``out_of_service`` / ``in_service``, when configured, tell
the device of each change (on connect too), after any sale in progress.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from kiosk_agent.config.load import schema_built_on_read
from kiosk_agent.data_class import data_class
from kiosk_agent.health.availability import follow_availability, short_reason
from kiosk_agent.money import MoneyError, cents_to_dollars, parse_wire_amount

# the schema is plain voluptuous, in a module of its own: checking a configuration loads none of
# this module (config.registry.platform_checks); re-exported, as a platform module provides it
from kiosk_agent.platforms import serial_line_schema
from kiosk_agent.platforms.base import (
    DevicePlatform,
    Dispenser,
    LateVends,
    SaleStarter,
    instance_name,
    link_reporter,
    open_sales,
    request_cancel,
    start_sale,
)
from kiosk_agent.platforms.serial import (
    SerialLink,
    SerialSettings,
    StateHandler,
)
from kiosk_agent.platforms.serial_line_schema import PRICE_UNIT
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, Flow, SaleRequest
from kiosk_agent.tasks import TaskSet

_LOGGER = logging.getLogger(__name__)

@data_class(slots=True)
class LineRules:
    vend_request: re.Pattern[str]
    dispense_ok: re.Pattern[str]
    approve: str
    dispense_failed: re.Pattern[str] | None = None
    cancel: re.Pattern[str] | None = None
    deny: str | None = None
    price_unit: str = PRICE_UNIT
    init: tuple[str, ...] = ()
    out_of_service: str | None = None
    in_service: str | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LineRules:
        return cls(
            vend_request=config["vend_request"],
            dispense_ok=config["dispense_ok"],
            approve=config["approve"],
            dispense_failed=config.get("dispense_failed"),
            cancel=config.get("cancel"),
            deny=config.get("deny"),
            price_unit=config.get("price_unit", PRICE_UNIT),
            init=tuple(config.get("init", ())),
            out_of_service=config.get("out_of_service"),
            in_service=config.get("in_service"),
        )

    def price_cents(self, text: str) -> int:
        try:
            return parse_wire_amount(text, self.price_unit)
        except MoneyError as err:
            raise ValueError(f"bad price: {err}") from None


def template_fields(
    product: str | None, price_text: str, cents: int, reason: str = ""
) -> dict[str, str]:
    return {
        "product": product or "",
        "price": price_text,
        "cents": str(cents),
        "amount": cents_to_dollars(cents),
        "reason": reason,
    }


class Vend(Dispenser):
    """One sale on the device; its Dispenser."""

    def __init__(self, device: SerialLineDevice, request: SaleRequest, price_text: str) -> None:
        super().__init__(request)
        self.device = device
        self.price_text = price_text
        self.vending = False
        self.cancelled: str | None = None

    def fields(self, reason: str = "") -> dict[str, str]:
        return template_fields(self.request.product, self.price_text, self.request.amount_cents,
                               reason)

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        if self.cancelled is not None:
            return self.end(DispenseStatus.CANCELLED, self.cancelled)
        self.vending = True
        self.device.gave_up_on = None  # a result from now on is this dispense's
        self.device.late.restart_sale = None
        if not self.device.send(self.device.rules.approve.format(**self.fields())):
            return self.end(DispenseStatus.CANCELLED, "device not connected: not approved")
        return await self.wait()

    def ended_as(self, outcome: DispenseOutcome) -> None:
        if self.vending:
            self.device.dispense_over()
        if outcome.status is DispenseStatus.TIMEOUT:  # the device may still say how it ended
            self.device.gave_up_on = self
            self.device.late.gave_up(self)
        elif self.vending and outcome.status is DispenseStatus.CANCELLED:
            # ended mid-dispense with no result (its cancel line, the agent stopping): the
            # device may still say the dispense succeeded, as after the vend timeout
            self.device.gave_up_on = self
            self.device.late.keep(self.sale_id, self.product)

    async def deny(self, reason: str) -> None:
        if self.ended:
            return
        if self.device.rules.deny is not None:
            self.device.send(self.device.rules.deny.format(**self.fields(reason)))
        self.end(DispenseStatus.CANCELLED, f"denied: {reason}")


class SerialLineDevice:
    def __init__(
        self,
        sales: SaleStarter,
        settings: SerialSettings,
        rules: LineRules,
        *,
        source: str,
        flow: Flow = Flow.CHARGE_CARD,
        terminal: str | None = None,
        max_cents: int | None = None,
        vend_timeout: float | None = None,
        on_link_state: StateHandler | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.sales = sales
        self.rules = rules
        self.name = source
        self.flow = flow
        self.terminal = terminal
        self.max_cents = max_cents
        self.vend_timeout = vend_timeout
        self.vend: Vend | None = None
        self.unmatched = 0
        self.outcomes: Counter[str] = Counter()  # dispense status -> count
        self._tasks = TaskSet()
        self._queued: Vend | None = None  # came while the last sale still held the terminal
        # Out of service: what the agent decided, and what the device was last told.
        self.available = True
        self.unavailable_reason = ""
        self._told_available = True  # init lines put a (re)connected device in service
        self.denied_out_of_service = 0
        # the link came back mid-dispense: its init lines wait for the dispense to end
        self._init_after_dispense = False
        self._stopping = False
        # the last dispense whose sale stopped waiting (vend timeout); a success heard for it
        # later is a product gone out unpaid
        self.gave_up_on: Vend | None = None
        self.late = LateVends(source, sales)
        self.unfollow: Callable[[], None] | None = None
        self.link = SerialLink(
            source, settings, self.handle_line, on_state=on_link_state,
            on_connected=self._on_connected, clock=clock,
        )

    async def start(self) -> None:
        self._stopping = False
        await self.link.start()

    async def stop(self) -> None:
        self._stopping = True
        if self.unfollow is not None:
            self.unfollow()
        self._queued = None
        # A vend in flight was heard during the agent's drain (Agent.drain), which parked its
        # sale if the result had not come by the drain's end: nothing is waited for here.
        vend = self.vend
        if vend is not None:
            vend.cancelled = "agent stopping"
            if vend.vending:
                vend.end(DispenseStatus.CANCELLED, "agent stopping")
            elif vend.sale_id is not None:
                # before the tasks are cancelled
                await request_cancel(self.sales, vend.sale_id, self.name)
        await self._tasks.cancel_all()
        await self.link.stop()

    def status(self) -> dict[str, Any]:
        return {
            "link": self.link.status(),
            "vending": self.vend is not None,  # the device's; a sale may go on after it
            "open_sales": open_sales(self.sales, self.name),
            "outcomes": dict(self.outcomes),
            "unmatched_lines": self.unmatched,
            "available": self.available,
            "unavailable_reason": self.unavailable_reason,
            "denied_out_of_service": self.denied_out_of_service,
            **self.late.status(),
        }

    def set_available(self, available: bool, reason: str = "") -> None:
        """The terminal can (or cannot) take cards; the device hears it after any sale."""
        self.available, self.unavailable_reason = available, reason
        self._tell_availability()

    def _tell_availability(self) -> None:
        if self.vend is not None or self._told_available == self.available:
            return  # never cut a sale short: _run_sale tells the device when it ends
        template = self.rules.in_service if self.available else self.rules.out_of_service
        if template is None:
            self._told_available = self.available
            return
        fields = template_fields(None, "", 0, short_reason(self.unavailable_reason))
        if self.send(template.format(**fields)):  # not connected: told on connect
            self._told_available = self.available

    def send(self, line: str) -> bool:
        return self.link.write_line(line)

    async def _on_connected(self) -> None:
        vend = self.vend
        if vend is not None and vend.vending and not vend.ended:
            # The link came back mid-dispense (a USB glitch): the device may still be dispensing
            # and say how it ended on this link, and the init lines may reset it. The dispense
            # keeps waiting (its vend timeout); the init lines come once it is over.
            _LOGGER.warning("%s: link back mid-dispense: still waiting for its result", self.name)
            self._init_after_dispense = True
            return
        if vend is None and self.late.hold_until_restart_heard(self.dispense_over):
            # The agent restarted mid-dispense: the device may still say how the dispense the
            # last stop or crash left ended (recovery listens until its vend timeout), and the
            # init lines may reset it. They come once recovery is done.
            _LOGGER.warning("%s: a dispense was in flight at the last stop or crash: listening "
                            "for its result before the init lines", self.name)
            self._init_after_dispense = True
            return
        self._init()

    def _init(self) -> None:
        self._init_after_dispense = False
        for line in self.rules.init:
            self.send(line)
        self._told_available = True
        self._tell_availability()

    def dispense_over(self) -> None:
        """A dispense ended (its result, its cancel line, its vend timeout, or recovery done
        listening for the one the last stop or crash left): init lines the link's return held
        back are sent now, unless a customer's request still waits for its answer (one refused
        while recovery held the terminal, heard as the hearing ended): then they come once that
        request is answered (:meth:`_vend_over`), never between it and its answer."""
        vend = self.vend
        if vend is not None and not vend.ended:
            return
        if self._init_after_dispense and self.link.connected and not self._stopping:
            self._init()

    def handle_line(self, line: str) -> None:
        rules = self.rules
        if match := rules.vend_request.search(line):
            self._on_vend_request(match)
        elif rules.dispense_ok.search(line):
            self._on_result(DispenseStatus.VENDED, "dispensed")
        elif rules.dispense_failed is not None and (match := rules.dispense_failed.search(line)):
            reason = match.groupdict().get("reason") or line
            self._on_result(DispenseStatus.FAILED, f"dispense failed: {reason}")
        elif rules.cancel is not None and rules.cancel.search(line):
            self._queued = None
            if self.vend is not None:
                self._cancel_vend("cancelled by the device")
            else:  # a dispense the last stop or crash left is over too
                self.late.restart_result(DispenseStatus.CANCELLED, "cancelled by the device")
        else:
            self.unmatched += 1
            _LOGGER.debug("%s: line matches no rule: %r", self.name, line[:80])

    def _on_vend_request(self, match: re.Match[str]) -> None:
        groups = match.groupdict()
        try:
            cents = self.rules.price_cents(groups["price"])
        except ValueError as err:
            self.link.noise("bad_vend_request", "%s: vend request ignored: %s", self.name, err)
            self.unmatched += 1
            return
        request = SaleRequest(
            source=self.name,
            flow=self.flow,
            amount_cents=cents,
            product=groups.get("product"),
            terminal=self.terminal,
            max_cents=self.max_cents,
            vend_timeout=self.vend_timeout,
        )
        vend = Vend(self, request, groups["price"])
        if self.vend is not None and self.vend.result.done():
            # The device is done with the last customer; that sale is still being settled.
            self._queued = vend
            return
        if self.vend is None and not self.available:
            self._deny_out_of_service(vend)
            return
        if self.vend is not None:
            self.link.noise(
                "vend_while_busy", "%s: vend request while a sale runs: denied", self.name
            )
            if self.rules.deny is not None:
                fields = template_fields(groups.get("product"), groups["price"], cents, "busy")
                self.send(self.rules.deny.format(**fields))
            return
        self._begin(vend)

    def _deny_out_of_service(self, vend: Vend) -> None:
        """No sale while the terminal cannot take cards: the device hears no, with why."""
        self.denied_out_of_service += 1
        self.link.noise(
            "out_of_service", "%s: vend request for %s while out of service: denied (%s)",
            self.name, vend.request.product, self.unavailable_reason,
        )
        if self.rules.deny is not None:
            self.send(self.rules.deny.format(**vend.fields(short_reason(self.unavailable_reason))))

    def _begin(self, vend: Vend) -> None:
        self.vend = vend
        self._tasks.spawn(self._run_sale(vend))

    def _on_result(self, status: DispenseStatus, detail: str) -> None:
        vend = self.vend
        if vend is None or not vend.vending or vend.ended:
            if vend is None and self.late.restart_result(status, detail):
                return  # the dispense the last stop or crash left: recovery listened for it
            late = self.gave_up_on
            late_sale = late.sale_id if late is not None else self.late.restart_sale
            if self.late.result(late_sale, status, detail):
                return  # its late success, or its failure (the maybe told closed)
            self.link.noise(
                "result_without_vend", "%s: %s with no dispense pending: ignored", self.name, detail
            )
            return
        vend.end(status, detail)

    def _cancel_vend(self, reason: str) -> None:
        vend = self.vend
        if vend is None:
            return
        vend.cancelled = reason
        if vend.vending:  # approved: the device may still say it dispensed
            vend.end(DispenseStatus.CANCELLED, reason, unheard=True)
        elif vend.sale_id is not None:
            self._tasks.spawn(request_cancel(self.sales, vend.sale_id, self.name))

    async def _run_sale(self, vend: Vend) -> None:
        try:
            sale = await start_sale(self.sales, vend.request, vend)
            if sale is None:
                return
            vend.sale_id = sale.sale_id
            if vend.cancelled is not None and not vend.vending:
                await request_cancel(self.sales, sale.sale_id, self.name)
            # free once the dispense outcome is known: the capture or the money given back
            # needs only the payments API, and the next customer need not wait for it
            await sale.terminal_released()
            if not vend.result.done():
                final = await sale.result()  # ended without a dispense: the device hears no
                await vend.deny(final.message or final.state.value)
            self.outcomes[vend.result.result().status.value] += 1
            self._vend_over(vend)
            final = await sale.result()
            # DEBUG: the flow logs each sale's end once, at INFO
            _LOGGER.debug("%s: sale %s %s", self.name, final.sale_id, final.state.value)
        finally:
            self._vend_over(vend)

    def _vend_over(self, vend: Vend) -> None:
        """The device and the terminal are done with ``vend``'s customer: the request queued
        behind it starts (once)."""
        if self.vend is not vend:
            return
        self.vend = None
        queued, self._queued = self._queued, None
        if queued is not None and not self.available:
            self._deny_out_of_service(queued)
        elif queued is not None:
            self._begin(queued)
        self.dispense_over()  # init lines held back while it waited for its answer
        self._tell_availability()  # a change during the sale, told now it has ended


class SerialLinePlatform(DevicePlatform[SerialLineDevice]):
    """The platform instance the agent keeps for a ``platform: serial_line`` trigger."""


async def async_setup_platform(agent: Any, config: dict[str, Any]) -> SerialLinePlatform:
    source = instance_name(config, "serial")
    device = SerialLineDevice(
        agent.sales,
        SerialSettings.from_config(config),
        LineRules.from_config(config),
        source=source,
        flow=Flow(config["flow"]),
        terminal=config.get("terminal"),
        max_cents=config["max_price"],
        vend_timeout=config.get("vend_timeout"),
        on_link_state=link_reporter(agent, source),
        clock=agent.clock,
    )
    device.unfollow = follow_availability(agent, config.get("terminal"), device.set_available)
    await device.start()
    return SerialLinePlatform(device)


__getattr__ = schema_built_on_read(__name__, lambda: serial_line_schema.PLATFORM_SCHEMA)
