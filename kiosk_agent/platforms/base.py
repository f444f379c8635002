"""What every platform needs from the agent, and the helpers they share.

Platforms reach the agent only through ``agent.sales`` (start and cancel sales), ``agent.events``
and ``agent.health``; ``SaleStarter`` is that first contract, so a protocol layer can be driven by
the real ``SaleRunner`` or by anything else of the same shape.

A platform reports facts: a selection, a vend result, an abort, its link's state. The sale
decides what they mean for the money and keeps the timers (the vend timeout is the sale's).
:class:`Dispenser` is each sale's side of that on the machine, one shape for every platform.
From ``sales`` a platform imports the dispenser's types (``sales.model``) and nothing else.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from kiosk_agent.sales.model import DispenseOutcome, DispenseStatus, SaleRequest, UnheardOutcome
from kiosk_agent.sales.model import Dispenser as SaleDispenser

_LOGGER = logging.getLogger(__name__)

# What the dispense ends as when the sale stops waiting for it (its vend timeout, the agent's
# stop): not dispensed, as far as the machine told us.
WAIT_GIVEN_UP = "no vend result while the sale waited"


class Dispenser:
    """One sale on one machine: the result future, the wait, the end (a ``sales.model.Dispenser``).

    A platform's subclass tells its machine what the sale decided (``dispense``: approve and
    :meth:`wait`; ``deny``) and reports what the machine says through :meth:`end`. The first
    end is the outcome; a later one (a late result, an abort after it) changes nothing.
    """

    def __init__(self, request: SaleRequest) -> None:
        self.request = request
        self.product = request.product
        self.vend_cents = request.amount_cents  # what a vend takes: the chosen price
        self.sale_id: str | None = None
        self.result: asyncio.Future[DispenseOutcome] = asyncio.get_running_loop().create_future()

    @property
    def ended(self) -> bool:
        return self.result.done()

    def end(self, status: DispenseStatus, detail: str, *, unheard: bool = False) -> DispenseOutcome:
        """Settle the outcome once; later calls get the first answer. Only a vend takes money:
        ``vended_cents`` is the chosen price for VENDED, else 0. ``unheard``: the approved vend
        was in the machine's hands and it said nothing of its end (``DispenseOutcome.unheard``:
        a person is told the product may have gone out)."""
        if not self.result.done():
            vended = self.vend_cents if status is DispenseStatus.VENDED else 0
            made = UnheardOutcome if unheard else DispenseOutcome
            outcome = made(status, vended, self.product, detail)
            self.result.set_result(outcome)
            self.ended_as(outcome)
        return self.result.result()

    def ended_as(self, outcome: DispenseOutcome) -> None:
        """Called once, with the outcome: a platform counts it or moves its machine on."""

    async def wait(self) -> DispenseOutcome:
        """The machine's result. No timer here: the sale bounds the dispense (its vend timeout)
        and cancels this wait, which then ends the dispense as TIMEOUT, so that a result
        arriving later is one with no vend pending."""
        try:
            return await asyncio.shield(self.result)
        except asyncio.CancelledError:
            self.end(DispenseStatus.TIMEOUT, WAIT_GIVEN_UP)
            raise

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        raise NotImplementedError

    async def deny(self, reason: str) -> None:
        raise NotImplementedError


class LateVends:
    """Vends heard after their sale stopped waiting for them (its vend timeout: the sale gives
    the money back), each a product gone out unpaid. The agent cannot take that money again;
    it says so once at WARNING, naming the sale, counts it in the platform's status, and tells
    the agent (``sales.late_vend``: journaled on the sale, a problem in health until a person
    acknowledges it: sales/late_vends.py). No money moves on it."""

    KEPT = 500  # sales given up on that a late result may still name

    def __init__(self, source: str, sales: object = None) -> None:
        self.source = source
        # the agent's SaleRunner (its late_vend), or a test's stand-in without one
        self._tell: Callable[[str, str | None, str], None] | None = getattr(
            sales, "late_vend", None)
        self.count = 0
        self.last_sale: str | None = None
        self._gave_up: OrderedDict[str, object] = OrderedDict()  # sale id -> product, or _TOLD
        # The sales of this trigger a stop or a crash left dispensing: the next start gives their
        # money back (recovery), and the machine may still say how the vend ended. Kept as given
        # up; ``restart_sale`` is the last of them, for a machine whose result names no sale
        # (until its next dispense is approved: the platform clears it)
        self.restart_sale: str | None = None
        self.restart_product: str | None = None  # its product (gpio: the buttons that sell it)
        # every sale of this trigger the last stop or crash left dispensing: the only ones a
        # result naming its sale (a kiosk app's) may settle after a restart
        self._left: frozenset[str] = frozenset()
        # the agent's SaleRunner: recovery listens for how a vend left dispensing ended
        self._sales = sales
        left = getattr(sales, "left_dispensing", None)
        for sale_id, product in left(source) if callable(left) else ():
            self.keep(sale_id, product)
            self.restart_sale, self.restart_product = sale_id, product
            self._left |= {sale_id}

    def hold_until_restart_heard(self, then: Callable[[], None]) -> bool:
        """Whether recovery listens for how the vend the last stop or crash left ended (this
        boot, until its vend timeout: sales/recovery.py); if so, ``then`` is called once it is
        done (scheduled: never from within this call). The platform holds back a setup that
        would end the controller's session (``C,0``, init lines) until then."""
        listening = getattr(self._sales, "listening_after_restart", None)
        if listening is None or self.restart_sale is None:
            return False
        future: asyncio.Future[Any] | None = listening(self.restart_sale)
        if future is None:
            return False
        future.add_done_callback(lambda _: then())
        return True

    def restart_result(
        self, status: DispenseStatus, detail: str, sale_id: str | None = None
    ) -> bool:
        """The machine's vend result, heard with no vend of this start pending: whether it was
        the one recovery listens for (then recovery settles that sale on it: a success is
        captured, a failure given back). ``sale_id``: the sale the result names (a kiosk app's);
        else the last one the last stop or crash left (a machine whose results name none).
        False: nobody listens (a success is then a late vend, :meth:`heard`), or the sale named
        is not one this trigger left dispensing: another trigger's, whose own machine's word
        alone settles it (2026-11-30, i42-money-attack: a second kiosk app's "vended" for the
        first's sale id was taken as the first machine's, and recovery captured the money)."""
        heard = getattr(self._sales, "restart_vend_heard", None)
        named = sale_id if sale_id is not None else self.restart_sale
        if heard is None or named is None or named not in self._left:
            return False
        product = self._gave_up.get(named)
        outcome = DispenseOutcome(status, 0, product if isinstance(product, str) else None,
                                  detail)
        if not heard(named, outcome):
            return False
        _LOGGER.warning("%s: %s for sale %s, left dispensing by the last stop or crash: "
                        "recovery settles it", self.source, detail, named)
        if status is DispenseStatus.VENDED:  # one product per vend: a repeat is no late vend
            self._gave_up.pop(named, None)
            if named == self.restart_sale:
                self.restart_sale = self.restart_product = None
        return True

    def gave_up(self, dispenser: Dispenser) -> None:
        """Keep ``dispenser``'s sale if it ended by the sale giving up (TIMEOUT)."""
        sale_id = dispenser.sale_id
        if sale_id is None or not dispenser.ended:
            return
        if dispenser.result.result().status is DispenseStatus.TIMEOUT:
            self.keep(sale_id, dispenser.product)

    def keep(self, sale_id: str | None, product: str | None) -> None:
        """Keep a sale the machine's own watch gave up on (a drop sensor's window)."""
        if sale_id is None:
            return
        self._gave_up.setdefault(sale_id, product)
        while len(self._gave_up) > self.KEPT:
            self._gave_up.popitem(last=False)

    def keeps(self, sale_id: str) -> bool:
        """Whether ``sale_id`` is a sale of this trigger's that gave up on its vend, or that the
        last stop or crash left dispensing: one whose result it may still hear."""
        return sale_id in self._gave_up or sale_id in self._left

    def heard(self, sale_id: str | None) -> bool:
        """A vend success for ``sale_id``: whether it came after its sale gave up (then said
        and counted, once; a repeat is not a second product)."""
        product = _NOT_KEPT if sale_id is None else self._gave_up.get(sale_id, _NOT_KEPT)
        if product is _NOT_KEPT or sale_id is None:
            return False
        if product is not _TOLD:
            self._gave_up[sale_id] = _TOLD
            self.count += 1
            self.last_sale = sale_id
            _LOGGER.warning(
                "%s: vend success for sale %s after its vend timeout (the sale gives its money "
                "back): the product %s went out unpaid", self.source, sale_id,
                product or "(unnamed)",
            )
            if self._tell is not None:
                try:
                    self._tell(sale_id, product if isinstance(product, str) else None,
                               self.source)
                except Exception:  # the platform goes on; the log holds the late vend
                    _LOGGER.exception("%s: the late vend of sale %s not told to the agent",
                                      self.source, sale_id)
        return True

    def failed(self, sale_id: str | None, detail: str) -> bool:
        """The machine said ``sale_id``'s vend failed after its sale gave up on it: nothing
        went out. Whether it was such a sale: then the vend is over (no success is waited for
        any more) and the agent closes the maybe a person was told of (``sales.late_vend_failed``:
        ``LateVendWatch.not_vended``), no person needed."""
        product = _NOT_KEPT if sale_id is None else self._gave_up.get(sale_id, _NOT_KEPT)
        if product is _NOT_KEPT or product is _TOLD or sale_id is None:
            return False
        del self._gave_up[sale_id]
        if sale_id == self.restart_sale:
            self.restart_sale = self.restart_product = None
        _LOGGER.info("%s: %s for sale %s after it gave up waiting: nothing went out",
                     self.source, detail, sale_id)
        tell = getattr(self._sales, "late_vend_failed", None)
        if callable(tell):
            try:
                tell(sale_id, self.source, detail)
            except Exception:  # the platform goes on; the maybe stays for a person
                _LOGGER.exception("%s: the failed vend of sale %s not told to the agent",
                                  self.source, sale_id)
        return True

    def result(self, sale_id: str | None, status: DispenseStatus, detail: str) -> bool:
        """A vend result the machine gave with no vend pending, taken as ``sale_id``'s (the
        sale that gave up on it): a success is :meth:`heard`, a failure :meth:`failed`.
        Whether it was such a sale's; else the platform says it is noise."""
        if status is DispenseStatus.VENDED:
            return self.heard(sale_id)
        if status is DispenseStatus.FAILED:
            return self.failed(sale_id, detail)
        return False

    def status(self) -> dict[str, Any]:
        return {"late_vends": self.count, "last_late_vend_sale": self.last_sale}


_TOLD = object()  # a late vend already said and counted
_NOT_KEPT = object()


class LiveSale(Protocol):
    """A sale not ended yet, as the journal holds it (``SaleRecord`` fits)."""

    @property
    def sale_id(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def state(self) -> enum.StrEnum: ...



class SaleStarter(Protocol):
    """``agent.sales``: start a sale for a trigger; cancel it while it waits for a card; wait
    the sale's pause before a card-first trigger's next offer; the sales not ended yet."""

    async def start(self, request: SaleRequest, dispenser: SaleDispenser) -> Any: ...

    async def cancel(self, sale_id: str) -> Any: ...

    async def pause_before_offer(self, source: str) -> None: ...

    @property
    def running(self) -> Sequence[LiveSale]: ...


def open_sales(sales: SaleStarter, source: str) -> dict[str, str]:
    """The trigger's sales that have not ended, each id with its state as journaled.

    A sale goes on after the machine is done with its customer (capturing, giving the money
    back, finding out a lost answer): a status shows these beside the machine's own state, so
    that "no session" never reads as "nothing going on"."""
    return {sale.sale_id: sale.state.value for sale in sales.running if sale.source == source}


def instance_name(config: dict[str, Any], default: str) -> str:
    """The trigger's name for logs, health and ``SaleRequest.source`` (``mdb:front``)."""
    return f"{config['platform']}:{config.get('name') or default}"


def link_reporter(agent: Any, name: str) -> Callable[[Any, str], None]:
    """A SerialLink state callback that tells the agent's health, if it has one."""
    health = getattr(agent, "health", None)

    def report(state: Any, detail: str) -> None:
        if health is not None:
            health.report_link(name, str(getattr(state, "value", state)), detail)

    return report


def describe_start_failure(err: BaseException) -> str:
    """Why a sale could not start (busy terminal, agent stopping), for logs and the machine."""
    return f"{type(err).__name__}: {err or type(err).__name__}"


async def start_sale(
    sales: SaleStarter, request: SaleRequest, dispenser: SaleDispenser
) -> Any:
    """Start a trigger's sale; None when refused at once (busy terminal, agent stopping).

    A refusal is logged and the machine hears no through ``dispenser.deny``.
    """
    try:
        return await sales.start(request, dispenser)
    except Exception as err:  # noqa: BLE001 - whatever the reason, the machine must hear no
        why = describe_start_failure(err)
        _LOGGER.warning("%s: sale not started: %s", request.source, why)
        await dispenser.deny(why)
        return None


async def request_cancel(sales: SaleStarter, sale_id: str, source: str) -> None:
    """Ask the runner to cancel a sale; one that ended meanwhile is only logged."""
    try:
        await sales.cancel(sale_id)
    except Exception as err:  # noqa: BLE001 - the sale may have ended meanwhile
        _LOGGER.warning("%s: could not cancel sale %s: %s", source, sale_id, err)


class Device(Protocol):
    """What a platform drives: a named device with its own stop and health status."""

    name: str

    async def stop(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


DeviceT = TypeVar("DeviceT", bound=Device)


class DevicePlatform(Generic[DeviceT]):
    """The platform instance the agent keeps for one device (the ``PlatformInstance`` contract)."""

    def __init__(self, device: DeviceT) -> None:
        self.device = device
        self.name = device.name

    async def stop(self) -> None:
        await self.device.stop()

    def status(self) -> dict[str, Any]:
        return self.device.status()
