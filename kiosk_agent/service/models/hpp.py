"""Models of hosted payment pages: the page to create or edit, and the link a customer pays on.

Amounts in decimal dollars (``Decimal``, sent as two-place strings), as choices.md fixes.
"""

from __future__ import annotations

import enum

from pydantic import model_validator

from kiosk_agent.service.models.common import RequestBody, RequestDollars, ServiceModel


class HostedPageOptionName(enum.StrEnum):
    CUSTOM_01 = "custom_01"
    CUSTOM_02 = "custom_02"
    CUSTOM_03 = "custom_03"
    CUSTOM_04 = "custom_04"
    CUSTOM_05 = "custom_05"
    INVOICE_ID = "invoice_id"
    ADDRESS = "address"
    PHONE = "phone"
    EMAIL = "email"


class HostedPageOption(ServiceModel):
    name: HostedPageOptionName | None = None
    value: str | None = None
    is_readonly: bool | None = None
    is_required: bool | None = None


class HostedPage(RequestBody):
    """A hosted payment page to create or edit. Amounts in dollars (sent as two-place strings)."""

    name: str | None = None
    cc_mid: str | None = None
    ach_mid: str | None = None
    name_on_account: str | None = None
    amount: RequestDollars | None = None
    lock_amount: bool | None = None
    disable_after_payment: bool | None = None
    hpp_options: list[HostedPageOption] | None = None
    min_amount: RequestDollars | None = None
    max_amount: RequestDollars | None = None

    @model_validator(mode="after")
    def _range_only_unlocked(self) -> HostedPage:
        if self.lock_amount and (self.min_amount is not None or self.max_amount is not None):
            raise ValueError("min_amount and max_amount are valid only when lock_amount is false")
        return self


class HostedPageLink(ServiceModel):
    """The answer of page creation: the link a customer pays on."""

    url: str

    @property
    def hpp_client_id(self) -> str:
        return hpp_client_id_from_url(self.url)


def hpp_client_id_from_url(url: str) -> str:
    """The page's id for edits: the last path segment of the url that creation returned."""
    path = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    client_id = path.rsplit("/", 1)[-1]
    if not client_id or "://" in client_id or client_id.endswith(":"):
        raise ValueError(f"no hosted page id in url {url!r}")
    return client_id
