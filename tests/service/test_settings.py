"""Service settings: what each interface needs, said clearly, and secrets never echoed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiosk_agent.service.client import ServiceClient, ServiceSettings
from kiosk_agent.service.errors import AuthenticationError, MissingCredentialsError
from kiosk_agent.service.models.payments import ChargeRequest
from kiosk_agent.sim.server import SimServer

from .scripted_server import ScriptedServer


def reporting_only(sim: SimServer) -> ServiceSettings:
    """What a back-office reporting tool holds: the OAuth client, no payments key, no mid."""
    info = sim.ready_info()
    return ServiceSettings(
        base_url=info["base_url"],
        client_id=info["client_id"],
        client_secret=info["client_secret"],
    )


async def test_reporting_and_boarding_need_no_payments_key(sim: SimServer) -> None:
    async with ServiceClient(reporting_only(sim)) as svc:
        transactions = [t async for t in svc.reporting.transactions(limit=3)]
        merchants = [m async for m in svc.boarding.merchants(limit=1)]
    assert len(transactions) == 3
    assert len(merchants) <= 1


async def test_a_payments_or_terminal_call_says_which_setting_is_missing(
    scripted: ScriptedServer,
) -> None:
    no_key = ServiceSettings(base_url=scripted.url, mid="999000000001")
    async with ServiceClient(no_key) as svc:
        with pytest.raises(MissingCredentialsError, match=r"no payments API key configured: set "
                           r"service\.api_key"):
            await svc.terminal.list()
        with pytest.raises(MissingCredentialsError, match=r"service\.api_key"):
            await svc.payments.charge(ChargeRequest(amount=100, account_token="tok"))
        with pytest.raises(MissingCredentialsError, match=r"service\.api_key"):
            svc.keys.current()

    no_mid = ServiceSettings(base_url=scripted.url, api_key="key-1")
    async with ServiceClient(no_mid) as svc:
        with pytest.raises(MissingCredentialsError, match=r"no merchant mid configured: set "
                           r"service\.mid"):
            await svc.payments.capture("t-1")
    assert scripted.requests == []  # refused before anything was sent


def test_missing_credentials_are_an_authentication_problem() -> None:
    # Callers that already tell a person "check the credentials" keep doing the right thing.
    assert issubclass(MissingCredentialsError, AuthenticationError)
    settings = ServiceSettings(base_url="http://127.0.0.1:1")
    assert settings.api_key is None
    with pytest.raises(MissingCredentialsError, match="KIOSK_MID"):
        _ = settings.mid


def test_mid_is_given_and_kept_by_its_name() -> None:
    settings = ServiceSettings(base_url="http://x", api_key="k", mid="999000000001")
    assert settings.mid == "999000000001"
    assert settings.replace(isv=True).mid == "999000000001"
    assert settings.replace(mid="999000000002").mid == "999000000002"
    assert settings.replace(api_key="k2").api_key is not None


@pytest.mark.parametrize("field", ["api_key", "mid"])
def test_a_blank_credential_is_a_mistake_not_an_absence(field: str) -> None:
    with pytest.raises(ValidationError, match=f"{field} is empty"):
        ServiceSettings.model_validate({"base_url": "http://x", field: "  "})


def test_a_refused_setting_never_echoes_a_secret() -> None:
    with pytest.raises(ValidationError) as refused:
        ServiceSettings.model_validate(
            {"base_url": "http://x", "api_key": ["live-key-secret"], "client_secret": 4111}
        )
    text = f"{refused.value} {refused.value!r}"
    assert "api_key" in text
    assert "client_secret" in text
    assert "live-key-secret" not in text
    assert "4111" not in text


def test_a_refused_address_is_not_echoed_either() -> None:
    with pytest.raises(ValidationError, match="base_url must start with http") as refused:
        ServiceSettings(base_url="ftp://tech:hunter2@payments.example.com")
    assert "hunter2" not in f"{refused.value} {refused.value!r}"
