"""An attack on i36-sale's listeners by kind: the agent's bus calls availability's and attention's
listeners only on the states they name (listen(kinds=)). A state left out of a listener's kinds
must be one it does nothing on, for every state there is (a state added later included)."""

from __future__ import annotations

import operator
from types import SimpleNamespace
from typing import Any

import pytest

from kiosk_agent.bus import EventBus
from kiosk_agent.health import availability
from kiosk_agent.health.availability import Availability
from kiosk_agent.sales import attention
from kiosk_agent.sales.attention import OutsideResolutions
from kiosk_agent.sales.model import SaleEvent
from kiosk_agent.sales.states import SaleState, Step


def _event(state: SaleState, step: Step | str = "") -> SaleEvent:
    return SaleEvent(sale_id="s1", order_id="o1", source="test:front", state=state,
                     amount_cents=250, step=step)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.parametrize("state", list(SaleState))
@pytest.mark.parametrize("step", ["", Step.RECEIPT])
def test_a_state_availability_is_not_called_on_is_one_it_does_nothing_on(
    state: SaleState, step: Step | str
) -> None:
    woken: list[bool] = []
    health: Any = SimpleNamespace(wake=lambda: woken.append(True))
    Availability.on_sale_event(health, _event(state, step))
    if state not in availability._SUSPECT_ENDS:
        assert woken == []


@pytest.mark.parametrize("state", list(SaleState))
def test_a_state_attention_is_not_called_on_is_one_it_does_nothing_on(state: SaleState) -> None:
    known: Any = SimpleNamespace(_attention={"s1"})
    OutsideResolutions._seen(known, _event(state))
    fresh: Any = SimpleNamespace(_attention=set())
    OutsideResolutions._seen(fresh, _event(state))
    if state not in attention._ATTENTION_OR_ENDED:
        assert known._attention == {"s1"}
        assert fresh._attention == set()


def test_the_agents_bus_calls_every_listener_named_for_a_state_and_no_other() -> None:
    bus: EventBus[SaleEvent] = EventBus(kind=operator.attrgetter("state"))
    heard: dict[str, list[SaleState]] = {"suspect": [], "all": []}
    bus.listen(lambda e: heard["suspect"].append(e.state), kinds=availability._SUSPECT_ENDS)
    bus.listen(lambda e: heard["all"].append(e.state))
    for state in SaleState:
        bus.publish(_event(state))
    assert heard["all"] == list(SaleState)
    assert heard["suspect"] == [s for s in SaleState if s in availability._SUSPECT_ENDS]
