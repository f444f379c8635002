"""Models of the payments interface a sale and its agent use: keys, charges, voids and refunds,
receipts. Billing plans (``plans``) and hosted pages (``hpp``) have modules of their own: a
running agent never builds them; nor the vault's (``vault``) unless an enroll sale saves a card.

Amounts follow choices.md: integer cents for charge, capture and void-or-refund.
"""


import enum
from typing import Any

from pydantic import AliasChoices, Field, field_serializer, field_validator, model_validator

from kiosk_agent.service.models.common import RequestBody, ServiceModel, Tolerant, YesNo


class ApiKeySet(ServiceModel):
    """The answer of an API key refresh."""

    api_key: str
    public_key: str
    refresh_token: str
    api_key_expires_at: int
    refresh_token_expires_at: int


class ChargeResultCode(enum.StrEnum):
    APPROVED = "A"
    RETRY = "B"
    DECLINED = "C"


class StoredCredentialType(enum.StrEnum):
    CUSTOMER = "C"  # customer present
    MERCHANT = "M"  # merchant-initiated


class ChargeRequest(RequestBody):
    """The body of ``POST /api/v1/charge``. ``amount`` is integer cents.

    Charge either an ``account_token`` or a vaulted ``payment_account_uuid``; the latter is a
    stored-credential charge and must say ``cof`` and ``cof_sched``.
    """

    amount: int = Field(gt=0)
    mid: str | None = None  # None: the client's merchant
    account_token: str | None = None
    payment_account_uuid: str | None = None
    expiration: str | None = None  # MMYY
    currency: str = "USD"
    capture: YesNo = True  # Y: authorize and capture; N: authorize only
    vault: YesNo | None = None
    order_id: str | None = None
    cvn: str | None = None
    cof: StoredCredentialType | None = None
    cof_sched: YesNo | None = None
    cof_perm: YesNo | None = None
    terminal_id: str | None = None
    user_identifier: str | None = None
    vault_holder_id: str | None = None
    name: str | None = None
    address1: str | None = None
    address2: str | None = None
    city: str | None = None
    region: str | None = None
    country: str | None = None
    account_zip: str | None = None
    phone: str | None = None
    email: str | None = None

    @field_validator("amount", mode="before")
    @classmethod
    def _integer_cents(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("amount must be integer cents (use kiosk_agent.money to convert)")
        return value

    @model_validator(mode="after")
    def _one_account(self) -> "ChargeRequest":
        if (self.account_token is None) == (self.payment_account_uuid is None):
            raise ValueError("give exactly one of account_token and payment_account_uuid")
        if self.payment_account_uuid is not None and (self.cof is None or self.cof_sched is None):
            raise ValueError(
                "a stored-credential charge (payment_account_uuid) needs cof (C or M) and cof_sched"
            )
        return self

    @field_serializer("capture", "vault", "cof_sched", "cof_perm")
    def _wire_flag(self, value: bool | None) -> str | None:
        return None if value is None else ("Y" if value else "N")  # on the wire: Y/N


class ChargeResult(ServiceModel):
    """The answer of charge and capture (and a charge-card interaction's result)."""

    result: Tolerant[ChargeResultCode]
    trans_id: str
    order_id: str | None = None
    auth_code: str | None = None
    amount: int | None = Field(default=None, ge=0)  # cents; a negative one is no answer
    currency: str = "USD"
    mid: str | None = None
    resp_code: str | None = Field(
        default=None, validation_alias=AliasChoices("resp_code", "respcode")
    )
    resp_text: str | None = Field(
        default=None, validation_alias=AliasChoices("resp_text", "resptext")
    )
    resp_proc: str | None = Field(
        default=None, validation_alias=AliasChoices("resp_proc", "respproc")
    )
    respstat: str | None = None
    vault_id: int | str | None = None
    payment_account_uuid: str | None = None

    @property
    def approved(self) -> bool:
        return self.result == ChargeResultCode.APPROVED


class VoidOrRefundResult(ServiceModel):
    """The answer of ``POST /api/v1/void-or-refund``; every field is required by the interface."""

    result: str
    trans_id: str
    resp_code: str
    resp_text: str
    resp_proc: str
    user_identifier: str
    mid: str
    amount: int
    currency: str
    order_id: str
    auth_code: str

    @property
    def voided(self) -> bool:
        return "void" in self.resp_text.lower()

    @property
    def refunded(self) -> bool:
        return "refund" in self.resp_text.lower()


class Surcharge(ServiceModel):
    surcharge: bool
    surcharge_amount: int  # cents
    surcharge_percent: str


class ReceiptSent(ServiceModel):
    sent: bool
