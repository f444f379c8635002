"""Billing plans: recurring scheduled payments from a vaulted payment account."""

from __future__ import annotations

from decimal import Decimal

from kiosk_agent.service.models.plans import BillingPlan, BillingPlanCreated, BillingPlanRequest
from kiosk_agent.service.parsing import parse, sent_back
from kiosk_agent.service.rrule import validate_rrule
from kiosk_agent.service.transport import MidPlacement, Transport

_PATH = "/api/v1/billing_plans"


class PlansClient:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def create(
        self,
        *,
        name: str,
        description: str,
        payment_account_uuid: str,
        amount: Decimal | str,
        rrule_pattern: str,
    ) -> int:
        """Create a plan charging ``amount`` dollars (``"12.50"``) by the rule; its id.

        Build ``rrule_pattern`` with :func:`kiosk_agent.service.rrule.build_rrule`.
        """
        validate_rrule(rrule_pattern)
        request = BillingPlanRequest(
            name=name,
            description=description,
            mid=self._transport.settings.mid,
            payment_account_uuid=payment_account_uuid,
            amount=amount,  # validated and made exact by the model
            rrule_pattern=rrule_pattern,
        )
        created = await self._transport.request_model(
            BillingPlanCreated,
            "POST",
            _PATH,
            json=request.to_wire(),
            mid=MidPlacement.NONE,
            what=f"create billing plan {name!r}",
        )
        return created.id

    async def get(self, plan_id: int) -> BillingPlan:
        return await self._transport.request_model(
            BillingPlan, "GET", f"{_PATH}/{int(plan_id)}", what=f"get billing plan {plan_id}"
        )

    async def cancel(self, plan_id: int) -> BillingPlan | None:
        """Cancel: status CANCELLED, every pending scheduled payment SKIPPED.

        The cancelled plan when the service sends it back.
        """
        what = f"cancel billing plan {plan_id}"
        data = await self._transport.request("DELETE", f"{_PATH}/{int(plan_id)}", what=what)
        return parse(BillingPlan, data, what=what) if sent_back(data) else None
