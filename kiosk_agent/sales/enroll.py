"""enroll: read a card and save it in the vault (optionally with a billing plan); no payment.

READING_CARD -> ENROLLING -> COMPLETED; a service that fails after the vault may have saved
the card: ATTENTION (a person looks). The terminal is free once the card is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kiosk_agent.money import cents_to_decimal, parse_price
from kiosk_agent.sales.live import SaleFlow
from kiosk_agent.sales.model import SaleEvent, SaleRequest
from kiosk_agent.sales.states import SaleState, Step
from kiosk_agent.service.errors import ServerError, ServiceError, ServiceUnreachableError

if TYPE_CHECKING:
    from kiosk_agent.service.models.vault import VaultAccountRequest


class EnrollFlow(SaleFlow):
    """Save the customer's card (and start their plan)."""

    receipts = False

    def opening(self) -> None:
        self.ask_for_card()  # with the sale: one commit

    async def sell(self) -> SaleEvent:
        card, ended = await self.read_card()
        if ended is not None:
            return ended
        with self.one_commit():  # the card read and the saving it leads to
            self.card_read(card)
            self.step(Step.VAULT_REQUEST, SaleState.ENROLLING, "saving the card")
        # saving the card (and its plan) needs only the service: the terminal is free
        await self.release_terminal(may_complete=False)
        try:
            account = await self.service.vault.create(_vault_request(card, self.request))
        except ServiceError as err:
            return self.finish(
                SaleState.ATTENTION
                if isinstance(err, (ServerError, ServiceUnreachableError))
                else SaleState.FAILED,
                Step.VAULT_FAILED,
                f"saving the card failed: {err}",
            )
        self.step(Step.VAULT_DONE, vault_uuid=account.uuid, last_four=account.last_four)
        plan = self.request.plan
        if plan:
            self.step(Step.PLAN_REQUEST, detail={"name": plan.get("name", "")})
            try:
                plan_id = await self.service.plans.create(**_plan_fields(plan, account.uuid))
            except ServiceError as err:
                return self.finish(
                    SaleState.ATTENTION,
                    Step.PLAN_FAILED,
                    f"the card was saved but the billing plan failed: {err}",
                )
            self.step(Step.PLAN_DONE, plan_id=str(plan_id))
        return self.finish(
            SaleState.COMPLETED, Step.COMPLETED, "card saved" + (" with a plan" if plan else "")
        )


def _vault_request(card: Any, request: SaleRequest) -> VaultAccountRequest:
    """The vault body: the card token (in memory only) and what the kiosk asked of the customer."""
    # here: a start imports this flow, and only an enroll sale the vault's models
    from kiosk_agent.service.models.vault import VaultAccountRequest

    info = request.metadata
    return VaultAccountRequest(
        account_token=card.token,
        expiration=card.expiration,
        name=info.get("name", "Kiosk customer"),
        email=request.email or info.get("email", ""),
        phone=info.get("phone", ""),
        account_zip=info.get("account_zip", ""),
        address1=info.get("address1", ""),
        address2=info.get("address2") or None,
        city=info.get("city", ""),
        region=info.get("region", ""),
        country=info.get("country", "US"),
    )


def _plan_fields(plan: Mapping[str, str], account_uuid: str) -> dict[str, Any]:
    """A billing plan from an enroll request: ``name``, ``amount`` ("12.50"), ``rrule``."""
    return {
        "name": plan.get("name") or f"kiosk-{account_uuid[:8]}",
        "description": plan.get("description", "kiosk enrollment"),
        "payment_account_uuid": account_uuid,
        "amount": cents_to_decimal(parse_price(plan["amount"])),
        "rrule_pattern": plan["rrule"],
    }
