"""Pydantic models of every resource of the service, re-exported in one place.

Each name is imported from its area's module on first use (PEP 562), so a process that
never boards a merchant or reads a report never builds those models: on a Pi Zero each area
costs tens of milliseconds at start and a few megabytes kept."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiosk_agent.service.models.boarding import *  # noqa: F403
    from kiosk_agent.service.models.common import (
        ErrorBody,
        ServiceModel,
        Tolerant,
        is_known,
    )
    from kiosk_agent.service.models.hpp import (
        HostedPage,
        HostedPageLink,
        HostedPageOption,
        HostedPageOptionName,
        hpp_client_id_from_url,
    )
    from kiosk_agent.service.models.payments import (
        ApiKeySet,
        ChargeRequest,
        ChargeResult,
        ChargeResultCode,
        ReceiptSent,
        StoredCredentialType,
        Surcharge,
        VoidOrRefundResult,
    )
    from kiosk_agent.service.models.plans import (
        BillingPlan,
        BillingPlanCreated,
        BillingPlanRequest,
        BillingPlanStatus,
        ScheduledPayment,
        ScheduledPaymentStatus,
    )
    from kiosk_agent.service.models.reporting import *  # noqa: F403
    from kiosk_agent.service.models.reports import *  # noqa: F403
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
    from kiosk_agent.service.models.vault import (
        VaultAccountRequest,
        VaultAccountType,
        VaultPaymentAccount,
    )

# each name re-exported from the areas every sale needs (and the vault's, an enroll sale's), and
# the area it lives in
_NAMED: dict[str, str] = {
    **dict.fromkeys(
        [
            "ErrorBody", "ServiceModel", "Tolerant", "is_known"
        ],
        "common",
    ),
    **dict.fromkeys(
        [
            "ApiKeySet", "ChargeRequest", "ChargeResult", "ChargeResultCode", "ReceiptSent",
            "StoredCredentialType", "Surcharge", "VoidOrRefundResult"
        ],
        "payments",
    ),
    **dict.fromkeys(["VaultAccountRequest", "VaultAccountType", "VaultPaymentAccount"], "vault"),
    "TransStatus": "statuses",  # reporting's, without building its models
    **dict.fromkeys(
        [
            "BillingPlan", "BillingPlanCreated", "BillingPlanRequest", "BillingPlanStatus",
            "ScheduledPayment", "ScheduledPaymentStatus"
        ],
        "plans",
    ),
    **dict.fromkeys(
        [
            "HostedPage", "HostedPageLink", "HostedPageOption", "HostedPageOptionName",
            "hpp_client_id_from_url"
        ],
        "hpp",
    ),
    **dict.fromkeys(
        [
            "Capabilities", "Interaction", "InteractionAccepted", "InteractionKind",
            "InteractionStatus", "PingResult", "ReadCardResult", "StageError", "Terminal",
            "TerminalConnection", "TerminalList", "WsToken"
        ],
        "terminal",
    ),
}
# areas whose every public name (their __all__) is importable from here, built on first use
_WHOLE = ("reporting", "reports", "boarding")

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


def __getattr__(name: str) -> Any:
    areas = [_NAMED[name]] if name in _NAMED else list(_WHOLE)
    for area in areas:
        module = importlib.import_module(f"{__name__}.{area}")
        if area in _NAMED.values() or name in module.__all__:
            value = getattr(module, name)
            globals()[name] = value  # found once, then a plain attribute
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
