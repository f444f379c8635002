"""The terminal interface against the simulator: readers, sessions and interactions whose
outcome is chosen by the amount's cents (..01 retry, ..02 declined, ..05 no card, ..07 fault)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import BadRequestError, ConflictError, NotFoundError
from kiosk_agent.service.models import (
    ChargeRequest,
    ChargeResultCode,
    Interaction,
    InteractionStatus,
)
from kiosk_agent.service.terminal import (
    CLOCK_BASELINE_S,
    CLOCK_RATE_TOLERANCE,
    LIFETIME_TOLERANCE,
)

from ..helpers import PythonCalls

READER = "SIM-0001"  # captures signatures, does not print
PRINTER = "SIM-0007"  # prints, does not capture signatures


async def test_list_reports_capabilities_per_terminal(service: ServiceClient) -> None:
    terminals = {t.device_id: t for t in await service.terminal.list()}
    assert len(terminals) == 8
    assert terminals[READER].capabilities.signature_capture
    assert not terminals[READER].capabilities.receipt_printing
    assert terminals[PRINTER].capabilities.receipt_printing
    assert sum(t.capabilities.receipt_printing for t in terminals.values()) == 2


async def test_connect_ping_disconnect(service: ServiceClient) -> None:
    assert (await service.terminal.connect(READER)).connected
    ping = await service.terminal.ping(READER)
    assert ping.online
    assert ping.device_id == READER
    assert not (await service.terminal.disconnect(READER)).connected


async def test_read_card_then_charge_the_token(service: ServiceClient) -> None:
    handle = await service.terminal.read_card(READER, 1500, confirm_amount=True)
    interaction = await handle.wait(timeout=10)
    assert interaction.status is InteractionStatus.SUCCEEDED
    card = interaction.read_card_result
    assert card is not None
    assert card.last_four is not None
    assert card.token not in repr(card)  # the token never shows in a repr
    charged = await service.payments.charge(
        ChargeRequest(amount=1500, account_token=card.token, expiration=card.expiration)
    )
    assert charged.approved


@pytest.mark.parametrize(
    ("amount", "code"),
    [(1000, ChargeResultCode.APPROVED), (1001, ChargeResultCode.RETRY),
     (1002, ChargeResultCode.DECLINED)],
)
async def test_charge_card_outcomes(
    service: ServiceClient, amount: int, code: ChargeResultCode
) -> None:
    handle = await service.terminal.charge_card(READER, amount, order_id=f"o-{amount}")
    assert handle.order_id == f"o-{amount}"
    interaction = await handle.wait(timeout=10)
    assert interaction.status is InteractionStatus.SUCCEEDED  # a decline is not a failure
    result = interaction.charge_result
    assert result is not None
    assert result.result is code
    assert result.order_id == f"o-{amount}"


async def test_a_wait_the_caller_bounds_enters_no_bound_of_its_own(
    service: ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a sale bounds its card wait on its own clock: the handle's wait(None) entered a timeout
    # of None besides (nothing armed, but made, entered and left at every sale)
    bounds: list[float | None] = []
    real = asyncio.timeout

    def recorded(delay: float | None) -> Any:
        bounds.append(delay)
        return real(delay)

    handle = await service.terminal.charge_card(READER, 1000, order_id="o-unbounded")
    monkeypatch.setattr(asyncio, "timeout", recorded)
    interaction = await asyncio.wait_for(handle.wait(), 10)
    monkeypatch.undo()
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert None not in bounds
    # each frame's read is still bounded by the interaction's lifetime: a timer of the
    # subscription's now (tests/service/test_cable.py), not a timeout entered around it


async def test_device_fault_is_failed_with_stage_errors(service: ServiceClient) -> None:
    interaction = await (await service.terminal.charge_card(READER, 1007)).wait(timeout=10)
    assert interaction.status is InteractionStatus.FAILED
    assert interaction.stage_errors[0].code == "device_fault"
    assert interaction.charge_result is None


async def test_missing_capability_is_a_non_fatal_stage_error(service: ServiceClient) -> None:
    handle = await service.terminal.charge_card(PRINTER, 1200, capture_signature=True)
    interaction = await handle.wait(timeout=10)
    assert interaction.status is InteractionStatus.SUCCEEDED
    assert [e.code for e in interaction.stage_errors] == ["capability_unsupported"]


async def test_no_card_expires_within_the_lifetime(sim_factory: Any, sim_settings: Any) -> None:
    fast = await sim_factory(time_scale=1000)  # 3 minutes last 0.18 s
    settings = sim_settings.model_copy(
        update={"base_url": fast.base_url, "ws_url": fast.ws_url, "reporting_url": fast.base_url}
    )
    async with ServiceClient(settings) as svc:
        interaction = await (await svc.terminal.read_card(READER, 1005)).wait(timeout=10)
    assert interaction.status is InteractionStatus.EXPIRED


async def test_busy_terminal_cancel_and_status(sim_factory: Any, sim_settings: Any) -> None:
    slow = await sim_factory(time_scale=1)  # the card comes after 1.5 s
    settings = sim_settings.model_copy(
        update={"base_url": slow.base_url, "ws_url": slow.ws_url, "reporting_url": slow.base_url}
    )
    async with ServiceClient(settings) as svc:
        handle = await svc.terminal.read_card(READER, 900)
        with pytest.raises(ConflictError) as busy:
            await svc.terminal.charge_card(READER, 900)
        assert busy.value.error == "terminal_busy"
        status = await svc.terminal.get_interaction(READER, "read_card", handle.interaction_id)
        assert status.status is InteractionStatus.PENDING
        cancelled = await svc.terminal.cancel(READER, handle.interaction_id)
        assert cancelled is not None
        assert cancelled.status is InteractionStatus.CANCELLED
        assert (await handle.wait(timeout=5)).status is InteractionStatus.CANCELLED
        with pytest.raises(ConflictError) as again:
            await svc.terminal.cancel(READER, handle.interaction_id)
        assert again.value.error == "not_cancellable"
        with pytest.raises(NotFoundError):
            await svc.terminal.get_interaction(READER, "read_card", "no-such-interaction")


async def test_print_receipt_only_where_the_terminal_prints(service: ServiceClient) -> None:
    charged = await (await service.terminal.charge_card(PRINTER, 800)).wait(timeout=10)
    assert charged.charge_result is not None
    trans_id = charged.charge_result.trans_id
    printed = await service.terminal.print_receipt(PRINTER, trans_id)
    assert printed["printed"] is True
    with pytest.raises(BadRequestError) as refused:
        await service.terminal.print_receipt(READER, trans_id)
    assert refused.value.error == "capability_unsupported"


async def test_amounts_are_integer_cents(service: ServiceClient) -> None:
    with pytest.raises(TypeError):
        await service.terminal.read_card(READER, 12.5)  # type: ignore[arg-type]


async def test_the_services_clock_and_lifetime_are_learned_and_a_mismatch_warned_once(
    service: ServiceClient, sim: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The fixture's simulator runs 50 times faster: records say 180 s, which is 3.6 real seconds.
    # The client learns the rate from when each start was answered and when the simulator made
    # its record, both within the start's call: the rate it can learn is bounded by those calls'
    # spans, 50 +- 1 % on a quick loop, wider on a starved one (58 from a 2.3 s baseline, when
    # a fixed 10 % was asserted).
    lifetime = sim.ready_info()["interaction_lifetime_s"]
    scale = 180.0 / lifetime
    loop = asyncio.get_running_loop()
    spans: list[tuple[float, float]] = []  # each start's call: (before, after) on the loop

    async def sale(device: str) -> None:
        before = loop.time()
        handle = await service.terminal.charge_card(device, 300)
        spans.append((before, loop.time()))
        await handle.wait(timeout=10)

    def rate_bounds(n: int) -> tuple[float, float]:
        """The rates the n-th start's record can tell, measured from the first's."""
        (b1, a1), (bn, an) = spans[0], spans[n]
        return scale * (bn - a1) / (an - b1), scale * (an - b1) / (bn - a1)

    service.terminal.expected_lifetime = 180.0  # planned for the real service
    await sale("SIM-0001")
    assert service.terminal.clock_rate is None  # one interaction cannot tell a clock's rate
    await asyncio.sleep(CLOCK_BASELINE_S)
    for device in ("SIM-0002", "SIM-0003"):
        await sale(device)
    low, high = rate_bounds(2)
    assert service.terminal.clock_rate is not None
    assert low * 0.999 <= service.terminal.clock_rate <= high * 1.001
    assert low > 1 + CLOCK_RATE_TOLERANCE  # told from real time
    assert service.terminal.lifetime_seen == pytest.approx(180.0 / service.terminal.clock_rate)
    warnings = [r.getMessage() for r in caplog.records if "interaction_lifetime" in r.getMessage()]
    assert all("but 180 s is expected" in warning for warning in warnings)
    # the second and third starts' lifetimes are one value when their rates cannot differ by
    # more than the tolerance (a quick loop); a starved one may measure two
    (low2, high2), (low3, high3) = rate_bounds(1), rate_bounds(2)
    one_value = high2 / low3 <= 1 + LIFETIME_TOLERANCE and high3 / low2 <= 1 + LIFETIME_TOLERANCE
    assert len(warnings) == 1 if one_value else 1 <= len(warnings) <= 2, (warnings, spans)
    caplog.clear()
    service.terminal.expected_lifetime = lifetime  # as the READY line says: no warning
    await sale("SIM-0004")
    low4, high4 = rate_bounds(3)
    warned = [r for r in caplog.records if "interaction_lifetime" in r.getMessage()]
    if scale / high4 >= 1 - LIFETIME_TOLERANCE and scale / low4 <= 1 + LIFETIME_TOLERANCE:
        assert not warned  # whatever the rate it learns, the lifetime is within the tolerance
    assert service.terminal.lifetime_seen == pytest.approx(180.0 / service.terminal.clock_rate)


def test_a_jittered_clock_measurement_is_still_one_mismatch_warned_once(
    service: ServiceClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Each record's answer arrives a few ms late on a busy machine, so the measured rate of a
    # 50x clock and the real lifetime it gives wobble (3.59 s, then 3.61 s): still one warning.
    from datetime import UTC, datetime, timedelta

    terminal = service.terminal
    terminal.expected_lifetime = 180.0
    base = datetime(2026, 1, 1, tzinfo=UTC)

    def record(n: int, service_s: float) -> Interaction:
        created = base + timedelta(seconds=service_s)
        return Interaction(
            interaction_id=f"i{n}", status=InteractionStatus.SUCCEEDED,
            created_at=created, expires_at=created + timedelta(seconds=180),
        )  # fmt: skip

    terminal.real_lifetime(0.0, record(0, 0.0))
    for n, (started, service_s) in enumerate([(2.0, 100.0), (2.5, 124.0), (3.0, 151.5)], 1):
        terminal.real_lifetime(started, record(n, service_s))
    assert terminal.clock_rate == pytest.approx(50, rel=0.02)
    warnings = [r for r in caplog.records if "interaction_lifetime" in r.getMessage()]
    assert len(warnings) == 1
    terminal.real_lifetime(4.0, record(4, 400.0))  # the clock really changed (x100): warned anew
    warnings = [r for r in caplog.records if "interaction_lifetime" in r.getMessage()]
    assert len(warnings) == 2


async def test_a_real_time_service_keeps_its_lifetime(sim_factory: Any) -> None:
    from kiosk_agent.cli.sim import settings_from_ready

    sim = await sim_factory(time_scale=1)
    async with ServiceClient(settings_from_ready(sim.ready_info())) as service:
        service.terminal.expected_lifetime = 180.0
        for device in ("SIM-0001", "SIM-0002"):
            await (await service.terminal.charge_card(device, 300)).wait(timeout=10)
            await asyncio.sleep(CLOCK_BASELINE_S / 2 + 0.1)
        assert (service.terminal.clock_rate, service.terminal.lifetime_seen) == (1.0, 180.0)


def test_a_terminals_path_is_quoted_once() -> None:
    # quote() and quote_from_bytes() were two Python calls at each request of a sale
    from urllib.parse import quote

    from kiosk_agent.service.terminal import _device

    for device_id in ("SIM-0001", "a/b c?#%", "ÜNIT 7"):
        _device(device_id)
        with PythonCalls() as calls:
            path = _device(device_id)
        assert path.endswith("/" + quote(device_id, safe=""))
        assert calls == []


def test_a_charge_cards_result_is_validated_once_and_kept_with_its_record() -> None:
    # parse_interaction checks a succeeded charge-card's result; the sale reads the same record
    # after (charge_card_result): one ChargeResult validation between them, kept on the record
    # (no module-level memo), not in its dump, and not in its equality with the same answer
    from pydantic import BaseModel

    from kiosk_agent.service.models import InteractionKind
    from kiosk_agent.service.parsing import charge_card_result, parse_interaction

    data = {"interaction_id": "i-1", "kind": "charge_card", "status": "succeeded",
            "result": {"result": "A", "trans_id": "t-1", "order_id": "KA1", "amount": 300}}
    asked = ("i-1", InteractionKind.CHARGE_CARD)
    validations: list[str] = []
    real = BaseModel.model_validate.__func__  # type: ignore[attr-defined]

    def counted(cls: type[BaseModel], obj: Any, *args: Any, **kwargs: Any) -> Any:
        validations.append(cls.__name__)
        return real(cls, obj, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(BaseModel, "model_validate", classmethod(counted))
        record = parse_interaction(data, what="x", asked=asked)
        result = charge_card_result(record, "KA1")
        again = charge_card_result(record, "KA1")
    assert validations == ["Interaction", "ChargeResult"]
    assert result is again is record.charge_result
    assert result is not None
    assert (result.trans_id, result.amount) == ("t-1", 300)
    assert "charge_result" not in record.model_dump()
    assert record == parse_interaction(data, what="x", asked=asked)  # not read yet: equal
