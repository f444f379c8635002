"""Buttons, relays and drop sensors on GPIO: the simplest kiosk there is.

Each button sells one product at one price. A press starts a sale; once paid, the button's relay
is pulsed to dispense, and when the button has a drop sensor the sale only counts as dispensed if
the sensor sees the product fall within ``sensor_timeout`` (otherwise the money is given back).

Lines are reached through libgpiod v2 (the ``gpiod`` package, imported only when a real chip is
opened) behind the small ``GpioChip`` interface, so tests can use a fake chip.

    - platform: gpio
      name: coffee-kiosk
      chip: /dev/gpiochip0
      available_output: 25      # optional: a lamp or relay, on while card payment works
      buttons:
        - {line: 17, product: espresso, price: "2.50", relay: 22, sensor: 27}
        - {line: 18, product: latte, price: "3.20", relay: 23}

Out of service (``health.availability``): while the terminal cannot take cards the "available"
output is off and presses start no sale (they are counted as refused); a sale already running
finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from kiosk_agent.config.load import schema_built_on_read
from kiosk_agent.config.registry import CannotStart
from kiosk_agent.data_class import data_class
from kiosk_agent.health.availability import follow_availability
from kiosk_agent.platforms import gpio_schema
from kiosk_agent.platforms.base import (
    DevicePlatform,
    Dispenser,
    LateVends,
    SaleStarter,
    instance_name,
    open_sales,
    request_cancel,
    start_sale,
)

# the schema and the environment's check are plain, in a module of their own: checking a
# configuration loads none of this module (config.registry.platform_checks); re-exported, as a
# platform module provides them
from kiosk_agent.platforms.gpio_schema import CHIP as CHIP
from kiosk_agent.platforms.gpio_schema import DEBOUNCE as DEBOUNCE
from kiosk_agent.platforms.gpio_schema import SENSOR_TIMEOUT as SENSOR_TIMEOUT
from kiosk_agent.platforms.gpio_schema import environment_problems as environment_problems
from kiosk_agent.sales.clock import SYSTEM_CLOCK, Clock
from kiosk_agent.sales.model import (
    DispenseOutcome,
    DispenseStatus,
    Flow,
    SaleRequest,
)
from kiosk_agent.tasks import TaskSet

_LOGGER = logging.getLogger(__name__)


# -- the chip interface ---------------------------------------------------------------------------


@data_class(frozen=True, slots=True)
class Edge:
    line: int
    active: bool  # True: the line became active (a press, a product falling past the sensor)
    timestamp_ns: int


class InputLines(Protocol):
    """Requested input lines with edge detection; ``fd`` is readable when edges are waiting."""

    @property
    def fd(self) -> int: ...

    def read_edges(self) -> list[Edge]: ...

    def release(self) -> None: ...


class OutputLines(Protocol):
    def set(self, line: int, active: bool) -> None: ...

    def release(self) -> None: ...


class GpioChip(Protocol):
    def request_inputs(
        self, lines: list[int], *, active_low: bool, pull_up: bool, debounce_s: float
    ) -> InputLines: ...

    def request_outputs(self, lines: list[int], *, active_low: bool) -> OutputLines: ...


class LibgpiodChip:
    """A real chip through libgpiod v2."""

    def __init__(self, path: str, consumer: str = "kiosk-agent") -> None:
        self.path = path
        self.consumer = consumer

    def request_inputs(
        self, lines: list[int], *, active_low: bool, pull_up: bool, debounce_s: float
    ) -> InputLines:
        import gpiod
        from gpiod.line import Bias, Direction
        from gpiod.line import Edge as GpiodEdge

        settings = gpiod.LineSettings(
            direction=Direction.INPUT,
            edge_detection=GpiodEdge.BOTH,
            bias=Bias.PULL_UP if pull_up else Bias.AS_IS,
            active_low=active_low,
            debounce_period=dt.timedelta(seconds=debounce_s),
        )
        request = gpiod.request_lines(
            self.path, consumer=self.consumer, config={tuple(lines): settings}
        )
        return _LibgpiodInputs(request)

    def request_outputs(self, lines: list[int], *, active_low: bool) -> OutputLines:
        import gpiod
        from gpiod.line import Direction, Value

        settings = gpiod.LineSettings(
            direction=Direction.OUTPUT, active_low=active_low, output_value=Value.INACTIVE
        )
        request = gpiod.request_lines(
            self.path, consumer=self.consumer, config={tuple(lines): settings}
        )
        return _LibgpiodOutputs(request)


class _LibgpiodInputs:
    def __init__(self, request: Any) -> None:
        self._request = request

    @property
    def fd(self) -> int:
        return int(self._request.fd)

    def read_edges(self) -> list[Edge]:
        from gpiod import EdgeEvent

        return [
            Edge(
                int(event.line_offset),
                event.event_type is EdgeEvent.Type.RISING_EDGE,
                int(event.timestamp_ns),
            )
            for event in self._request.read_edge_events()
        ]

    def release(self) -> None:
        self._request.release()


class _LibgpiodOutputs:
    def __init__(self, request: Any) -> None:
        self._request = request

    def set(self, line: int, active: bool) -> None:
        from gpiod.line import Value

        self._request.set_value(line, Value.ACTIVE if active else Value.INACTIVE)

    def release(self) -> None:
        self._request.release()


# -- configuration --------------------------------------------------------------------------------

@data_class(frozen=True, slots=True)
class Button:
    line: int
    product: str
    price_cents: int
    relay: int
    pulse: float
    sensor: int | None = None


# -- the platform ---------------------------------------------------------------------------------


class _Drop(Dispenser):
    """One sale's dispense: pulse the relay, then (if there is a sensor) watch it fall.

    The drop sensor's window is the machine's fact (a product falls within it after the pulse or
    did not come out: FAILED), kept here, on the agent's clock, as MDB's link keeps its own
    non-response time: it is how a silent sensor is read, not a sale's deadline. The vend
    timeout over it is the sale's (tests/test_layers.py's PLATFORM_TIMERS)."""

    def __init__(self, kiosk: GpioKiosk, button: Button, request: SaleRequest) -> None:
        super().__init__(request)
        self.kiosk = kiosk
        self.button = button
        self.watching = False
        self.dispensing = False
        self.dispensed = asyncio.Event()  # the dispense step is over, whatever its outcome

    async def dispense(self, authorized_cents: int) -> DispenseOutcome:
        button = self.button
        if self.kiosk.stopping:
            return self.end(DispenseStatus.CANCELLED, "kiosk stopping")
        self.dispensing = True
        self.watching = button.sensor is not None
        self.kiosk.gave_up_on = None  # a fall from now on is this dispense's
        self.kiosk.late.restart_sale = None
        try:
            await self.kiosk.pulse(button.relay, button.pulse)
            if button.sensor is None:
                return self.end(DispenseStatus.VENDED, "relay pulsed")
            with contextlib.suppress(TimeoutError):
                await self.kiosk.clock.wait_for(self.wait(), self.kiosk.sensor_timeout)
            # the relay fired: the product may be stuck and fall later (unheard, told)
            outcome = self.end(
                DispenseStatus.FAILED,
                f"drop sensor saw nothing within {self.kiosk.sensor_timeout:g}s",
                unheard=True,
            )
            if outcome.status is DispenseStatus.FAILED:  # a fall seen later: out unpaid
                self.kiosk.gave_up_on = self
                self.kiosk.late.keep(self.sale_id, self.product)
            return outcome
        finally:
            self.watching = False
            self.dispensed.set()

    def fell(self) -> None:
        """The drop sensor saw the product fall."""
        if self.watching:
            self.end(DispenseStatus.VENDED, "drop sensor confirmed")

    async def wait(self) -> DispenseOutcome:
        # the sensor's window ends the watch, not the sale: FAILED is said above, not TIMEOUT
        return await asyncio.shield(self.result)

    async def deny(self, reason: str) -> None:
        _LOGGER.info("%s: %s not dispensed: %s", self.kiosk.name, self.button.product, reason)


class GpioKiosk:
    def __init__(
        self,
        sales: SaleStarter,
        chip: GpioChip,
        buttons: list[Button],
        *,
        source: str,
        flow: Flow = Flow.CHARGE_CARD,
        terminal: str | None = None,
        max_cents: int | None = None,
        debounce: float = DEBOUNCE,
        sensor_timeout: float = SENSOR_TIMEOUT,
        vend_timeout: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
        buttons_active_low: bool = True,
        pull_up: bool = True,
        relays_active_low: bool = False,
        sensors_active_low: bool = False,
        available_output: int | None = None,
        available_active_low: bool = False,
    ) -> None:
        self.sales = sales
        self.chip = chip
        self.buttons = {b.line: b for b in buttons}
        self.sensors = {b.sensor: b for b in buttons if b.sensor is not None}
        # the last dispense whose sensor window closed unseen; a fall after it went out unpaid
        self.gave_up_on: _Drop | None = None
        self.late = LateVends(source, sales)
        # The sale the last stop or crash left dispensing (recovery gives its money back): a
        # fall past the sensor of a button selling its product, before this start's first
        # dispense, is its product gone out unpaid (one sale at a time: no other can be)
        restart = self.late.restart_product
        self._restart_sensors = frozenset(
            b.sensor for b in buttons if b.sensor is not None and b.product == restart
        ) if restart is not None else frozenset()
        self.name = source
        self.flow = flow
        self.terminal = terminal
        self.max_cents = max_cents
        self.debounce = debounce
        self.sensor_timeout = sensor_timeout
        self.vend_timeout = vend_timeout
        self.clock = clock  # the sale's: the drop sensor's window runs on it
        self._levels = (buttons_active_low, pull_up, relays_active_low, sensors_active_low)
        self._last_press: dict[int, int] = {}  # line -> timestamp_ns of the last accepted edge
        self._drop: _Drop | None = None
        self.stopping = False
        self._busy = False
        self._inputs: list[InputLines] = []
        self._outputs: OutputLines | None = None
        self._tasks = TaskSet()
        self.presses = 0
        self.ignored_presses = 0
        self.refused_presses = 0  # pressed while out of service: no sale started
        self.outcomes: Counter[str] = Counter()  # sale state -> count
        # Out of service: the terminal cannot take cards; the lamp says so.
        self.available = True
        self.unavailable_reason = ""
        self.available_output = available_output
        self._available_active_low = available_active_low
        self._lamp: OutputLines | None = None
        self.unfollow: Callable[[], None] | None = None

    async def start(self) -> None:
        buttons_low, pull_up, relays_low, sensors_low = self._levels
        loop = asyncio.get_running_loop()
        groups = [(list(self.buttons), buttons_low, pull_up)]
        if self.sensors:
            groups.append((list(self.sensors), sensors_low, False))
        for lines, active_low, pull in groups:
            inputs = self.chip.request_inputs(
                sorted(lines), active_low=active_low, pull_up=pull, debounce_s=self.debounce
            )
            self._inputs.append(inputs)
            loop.add_reader(inputs.fd, self._edges_ready, inputs)
        relays = sorted({b.relay for b in self.buttons.values()})
        self._outputs = self.chip.request_outputs(relays, active_low=relays_low)
        if self.available_output is not None:
            self._lamp = self.chip.request_outputs(
                [self.available_output], active_low=self._available_active_low
            )
            self._lamp.set(self.available_output, self.available)

    def set_available(self, available: bool, reason: str = "") -> None:
        """Card payment works (or not): the lamp follows at once; presses are refused."""
        if available != self.available:
            log = _LOGGER.info if available else _LOGGER.warning
            log("%s: card payment %s %s", self.name,
                "available" if available else "unavailable:", reason)
        self.available, self.unavailable_reason = available, reason
        if self._lamp is not None and self.available_output is not None:
            self._lamp.set(self.available_output, available)

    async def stop(self) -> None:
        self.stopping = True
        if self.unfollow is not None:
            self.unfollow()
        drop = self._drop
        if drop is not None and not drop.dispensing and drop.sale_id is not None:
            # Still waiting for the card: the customer gets nothing from a stopping kiosk.
            await request_cancel(self.sales, drop.sale_id, self.name)
        elif drop is not None and drop.dispensing:
            # A relay is pulsing or a sensor is watching: let that finish before letting go.
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(
                    drop.dispensed.wait(), drop.button.pulse + self.sensor_timeout + 1.0
                )
        loop = asyncio.get_running_loop()
        await self._tasks.cancel_all()
        for inputs in self._inputs:
            loop.remove_reader(inputs.fd)
            inputs.release()
        self._inputs.clear()
        if self._outputs is not None:
            for relay in {b.relay for b in self.buttons.values()}:
                self._outputs.set(relay, False)  # never leave a relay energized
            self._outputs.release()
            self._outputs = None
        if self._lamp is not None and self.available_output is not None:
            self._lamp.set(self.available_output, False)  # a stopped agent takes no cards
            self._lamp.release()
            self._lamp = None

    def status(self) -> dict[str, Any]:
        return {
            "busy": self._busy,  # the buttons' (a press is ignored); a sale may go on after
            "open_sales": open_sales(self.sales, self.name),
            "presses": self.presses,
            "ignored_presses": self.ignored_presses,
            "refused_presses": self.refused_presses,
            "outcomes": dict(self.outcomes),
            "available": self.available,
            "unavailable_reason": self.unavailable_reason,
            **self.late.status(),
        }

    async def pulse(self, relay: int, seconds: float) -> None:
        if self._outputs is None:
            raise RuntimeError("a relay pulsed before the GPIO outputs were opened")
        self._outputs.set(relay, True)
        try:
            await asyncio.sleep(seconds)  # the relay's physical pulse, not a wait of the sale
        finally:
            self._outputs.set(relay, False)

    # -- edges ---------------------------------------------------------------------------------

    def _edges_ready(self, inputs: InputLines) -> None:
        try:
            edges = inputs.read_edges()
        except OSError as err:
            _LOGGER.warning("%s: reading GPIO edges failed: %s", self.name, err)
            return
        for edge in edges:
            if not edge.active:
                continue
            if edge.line in self.buttons:
                self._on_press(self.buttons[edge.line], edge.timestamp_ns)
            elif edge.line in self.sensors:
                self._on_fall(edge.line)

    def _on_fall(self, sensor: int) -> None:
        drop = self._drop
        if drop is not None and drop.watching:
            drop.fell()
            return
        late = self.gave_up_on
        if late is not None:
            if late.button.sensor == sensor:
                self.late.heard(late.sale_id)  # the sensor's window had closed: money goes back
            return
        restart = self.late.restart_sale
        # left dispensing by the last stop or crash: recovery settles it while it listens
        # (until its vend timeout), else it is a late vend
        if restart is not None and sensor in self._restart_sensors and not (
                self.late.restart_result(DispenseStatus.VENDED,
                                         "drop sensor saw it fall after the restart")):
            self.late.heard(restart)

    def _on_press(self, button: Button, timestamp_ns: int) -> None:
        # The kernel debounces where the chip can; this catches the chips that cannot.
        last = self._last_press.get(button.line)
        if last is not None and (timestamp_ns - last) / 1e9 < self.debounce:
            return  # contact bounce, not a second press
        self._last_press[button.line] = timestamp_ns
        self.presses += 1
        if self._busy:
            self.ignored_presses += 1
            _LOGGER.info("%s: %s pressed while a sale runs: ignored", self.name, button.product)
            return
        if not self.available:
            self.refused_presses += 1
            _LOGGER.info("%s: %s pressed while card payment is unavailable (%s): no sale",
                         self.name, button.product, self.unavailable_reason)
            return
        self._busy = True
        self._tasks.spawn(self._sell(button))

    async def _sell(self, button: Button) -> None:
        request = SaleRequest(
            source=self.name,
            flow=self.flow,
            amount_cents=button.price_cents,
            product=button.product,
            terminal=self.terminal,
            max_cents=self.max_cents,
            metadata={"button": str(button.line)},
            vend_timeout=self.vend_timeout,
        )
        drop = _Drop(self, button, request)
        self._drop = drop
        released = False
        try:
            sale = await start_sale(self.sales, request, drop)
            if sale is None:
                return
            drop.sale_id = sale.sale_id
            # Dispensed (or not) and the terminal free: the next press may start its sale while
            # this one captures or gives the money back, as the runner allows.
            await sale.terminal_released()
            released = True
            self._free(drop)
            final = await sale.result()
            self.outcomes[final.state.value] += 1
        finally:
            if not released:
                self._free(drop)

    def _free(self, drop: _Drop) -> None:
        """The buttons take a press again (the sale of ``drop`` has let go of the machine)."""
        if self._drop is drop:
            self._drop = None
        self._busy = False


async def async_setup_platform(agent: Any, config: dict[str, Any]) -> GpioPlatform:
    problems = environment_problems(config)
    if problems:
        raise CannotStart("; ".join(problems))
    try:
        return await setup_with_chip(agent, config, LibgpiodChip(config["chip"]))
    except OSError as err:  # a line another program holds, a chip this user may not open
        raise CannotStart(
            f"cannot take its lines on {config['chip']}: {err.strerror or err} (another program "
            "holding them, or a user not in the gpio group)"
        ) from err


async def setup_with_chip(agent: Any, config: dict[str, Any], chip: GpioChip) -> GpioPlatform:
    buttons = [
        Button(
            line=b["line"],
            product=b["product"],
            price_cents=b["price"],
            relay=b["relay"],
            pulse=b.get("pulse", config["pulse"]),
            sensor=b.get("sensor"),
        )
        for b in config["buttons"]
    ]
    kiosk = GpioKiosk(
        agent.sales,
        chip,
        buttons,
        source=instance_name(config, "gpio"),
        flow=Flow(config["flow"]),
        terminal=config.get("terminal"),
        max_cents=config["max_price"],
        debounce=config["debounce"],
        sensor_timeout=config["sensor_timeout"],
        vend_timeout=config.get("vend_timeout"),
        clock=agent.clock,
        buttons_active_low=config["buttons_active_low"],
        pull_up=config["pull_up"],
        relays_active_low=config["relays_active_low"],
        sensors_active_low=config["sensors_active_low"],
        available_output=config.get("available_output"),
        available_active_low=config["available_active_low"],
    )
    kiosk.unfollow = follow_availability(agent, config.get("terminal"), kiosk.set_available)
    await kiosk.start()
    return GpioPlatform(kiosk)


class GpioPlatform(DevicePlatform[GpioKiosk]):
    """The platform instance the agent keeps for a ``platform: gpio`` trigger."""


__getattr__ = schema_built_on_read(__name__, lambda: gpio_schema.PLATFORM_SCHEMA)
