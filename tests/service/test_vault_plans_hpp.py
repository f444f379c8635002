"""Vault, billing plans (with build_rrule) and hosted pages against the simulator."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from kiosk_agent.service.client import ServiceClient
from kiosk_agent.service.errors import BadRequestError, NotFoundError
from kiosk_agent.service.models import (
    BillingPlanStatus,
    ChargeRequest,
    HostedPage,
    HostedPageOption,
    ScheduledPaymentStatus,
    VaultAccountRequest,
)
from kiosk_agent.service.rrule import Frequency, build_rrule

TOKEN = "9412345678901111"


def account(**changes: str) -> VaultAccountRequest:
    fields = {
        "account_token": TOKEN, "name": "Pat Doe", "account_zip": "10001",
        "address1": "1 Main St", "city": "New York", "region": "NY", "country": "US",
        "email": "pat@example.com", "phone": "5555550100", "expiration": "1230",
    }  # fmt: skip
    return VaultAccountRequest.model_validate({**fields, **changes})


async def test_vault_create_get_update_delete(service: ServiceClient) -> None:
    created = await service.vault.create(account())
    assert created.last_four == "1111"
    assert not created.deleted
    assert TOKEN not in repr(created)
    fetched = await service.vault.get(created.uuid)
    assert fetched.uuid == created.uuid
    updated = await service.vault.update(created.uuid, nickname="work card")
    assert updated.nickname == "work card"
    assert updated.city == "New York"  # fields not sent keep their value
    await service.vault.delete(created.uuid)
    with pytest.raises(NotFoundError):
        await service.vault.get(created.uuid)


async def test_vaulted_account_is_charged_as_a_stored_credential(service: ServiceClient) -> None:
    created = await service.vault.create(account())
    charged = await service.payments.charge(
        ChargeRequest(amount=990, payment_account_uuid=created.uuid, cof="M", cof_sched=False)
    )
    assert charged.approved


async def test_billing_plan_create_get_cancel(service: ServiceClient) -> None:
    vaulted = await service.vault.create(account())
    rule = build_rrule(date(2027, 1, 1), Frequency.MONTHLY, until=date(2027, 6, 1))
    plan_id = await service.plans.create(
        name="locker-rental", description="monthly locker", payment_account_uuid=vaulted.uuid,
        amount="12.50", rrule_pattern=rule,
    )  # fmt: skip
    plan = await service.plans.get(plan_id)
    assert plan.status is BillingPlanStatus.ACTIVE
    assert plan.amount == Decimal("12.50")
    assert [p.payment_number for p in plan.scheduled_payments] == [1, 2, 3, 4, 5, 6]
    assert plan.scheduled_payments[0].amount_scheduled == Decimal("12.5")
    await service.plans.cancel(plan_id)
    cancelled = await service.plans.get(plan_id)
    assert cancelled.status is BillingPlanStatus.CANCELLED
    assert {p.payment_status for p in cancelled.scheduled_payments} == {
        ScheduledPaymentStatus.SKIPPED
    }
    with pytest.raises(NotFoundError):
        await service.plans.get(987654)


async def test_hosted_page_create_and_edit(service: ServiceClient) -> None:
    page = HostedPage(
        name="Locker deposit",
        amount=Decimal("20.00"),
        lock_amount=True,
        hpp_options=[HostedPageOption(name="email", is_required=True)],
    )
    link = await service.hpp.create(page)
    assert link.url.endswith(link.hpp_client_id)
    changes = HostedPage(
        name="Locker deposit (new)",
        lock_amount=False,
        min_amount=Decimal("5"),
        max_amount=Decimal("50"),
    )
    edited = await service.hpp.edit(link.url, changes)
    assert edited is None or edited.hpp_client_id == link.hpp_client_id
    with pytest.raises(ValueError, match="cc_mid"):
        await service.hpp.edit(link.hpp_client_id, HostedPage(cc_mid="999000000002"))


async def test_hosted_page_bad_request_is_typed(service: ServiceClient) -> None:
    with pytest.raises(BadRequestError):
        await service.hpp.create(HostedPage(name="x", amount=Decimal("-1.00")))
