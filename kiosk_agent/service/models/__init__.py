"""Pydantic models of every resource of the service, re-exported in one place."""

from __future__ import annotations

from kiosk_agent.service.models.boarding import *  # noqa: F403
from kiosk_agent.service.models.common import (
    ErrorBody,
    ServiceModel,
    Tolerant,
    is_known,
)
from kiosk_agent.service.models.payments import (
    ApiKeySet,
    BillingPlan,
    BillingPlanCreated,
    BillingPlanRequest,
    BillingPlanStatus,
    ChargeRequest,
    ChargeResult,
    ChargeResultCode,
    HostedPage,
    HostedPageLink,
    HostedPageOption,
    HostedPageOptionName,
    ReceiptSent,
    ScheduledPayment,
    ScheduledPaymentStatus,
    StoredCredentialType,
    Surcharge,
    VaultAccountRequest,
    VaultAccountType,
    VaultPaymentAccount,
    VoidOrRefundResult,
    hpp_client_id_from_url,
)
from kiosk_agent.service.models.reporting import *  # noqa: F403
from kiosk_agent.service.models.terminal import (
    Capabilities,
    Interaction,
    InteractionAccepted,
    InteractionKind,
    InteractionStatus,
    PingResult,
    ReadCardResult,
    StageError,
    Terminal,
    TerminalConnection,
    TerminalList,
    WsToken,
)

__all__ = [  # noqa: RUF022  (reporting and boarding names are importable by name too)
    "ApiKeySet", "BillingPlan", "BillingPlanCreated", "BillingPlanRequest", "BillingPlanStatus",
    "Capabilities", "ChargeRequest", "ChargeResult", "ChargeResultCode", "ErrorBody", "HostedPage",
    "HostedPageLink", "HostedPageOption", "HostedPageOptionName", "hpp_client_id_from_url",
    "Interaction", "InteractionAccepted", "InteractionKind", "InteractionStatus", "is_known",
    "PingResult", "ReadCardResult", "ReceiptSent", "ScheduledPayment", "ScheduledPaymentStatus",
    "ServiceModel", "StageError", "StoredCredentialType", "Surcharge", "Terminal",
    "TerminalConnection", "TerminalList", "Tolerant", "VaultAccountRequest", "VaultAccountType",
    "VaultPaymentAccount", "VoidOrRefundResult", "WsToken",
]
