"""How a service command reaches the service: its settings (the configuration's service, the
``KIOSK_*`` variables, ``--timeout``: the contract's, cli/contract.py) and a started client.
Imported by the commands that call the service; a running agent makes its own
(``app.configured_service``) and never loads this (docs/architecture.md, "Idle memory: tenth
round")."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiosk_agent.cli.contract import (
    CONFIG_ENV,
    ENVIRONMENT,
    EXIT_USAGE,
    SERVICE_ADDRESS_FROM,
    STATUS,
    CliError,
    first_problem,
    load,
    optional_config_path,
)
from kiosk_agent.cli.waiting import waiting

if TYPE_CHECKING:
    from kiosk_agent.service.client import ServiceClient
    from kiosk_agent.service.settings import ServiceSettings


@contextlib.asynccontextmanager
async def service_settings(
    args: argparse.Namespace, *, needs: str = "api"
) -> AsyncIterator[ServiceSettings]:
    """The settings of a service command: the configuration's service (``app.configured_service``:
    the embedded simulator is started for as long as the command runs when it has one),
    overridden by ``KIOSK_*`` variables, and ``--timeout`` when given.

    ``needs`` is ``"api"`` (payments and terminal: base_url, api_key, mid) or ``"oauth"``
    (reporting and boarding: base_url or reporting_url, client_id, client_secret).
    """
    async with contextlib.AsyncExitStack() as stack:
        values: dict[str, Any] = {}
        path = optional_config_path(args)
        if path is not None:
            values.update(await stack.enter_async_context(_configured_values(path)))
        for field, variable in ENVIRONMENT.items():
            if os.environ.get(variable):
                values[field] = os.environ[variable]
        _note_address_origin(path, values, needs)
        yield _settings(values, needs, getattr(args, "timeout", None), path)


@contextlib.asynccontextmanager
async def _configured_values(path: Path) -> AsyncIterator[dict[str, Any]]:
    """The service settings the agent itself would use with this configuration, by the names
    the settings take (read by the agent's own loader, so ``!secret``, the defaults and the
    place of the rotated key are the same for both)."""
    from pydantic import ValidationError

    from kiosk_agent.app import configured_service
    from kiosk_agent.cli.embedded import RunningSimulator, command_simulator

    config = load(path, check_platforms=False)
    settings_made = False
    try:
        async with configured_service(config, command_simulator(config)) as service:
            settings_made = True
            if isinstance(service.simulator, RunningSimulator):
                STATUS.done(f"{path}: the simulator of the demo running on it, at "
                            f"{service.simulator.base_url} (process {service.simulator.pid})")
            elif service.simulator is not None:
                STATUS.done(f"{path}: started the embedded simulator at "
                            f"{service.simulator.base_url} for this command (its state ends "
                            "with it)")
            yield _plain_settings(service.settings)
    except ValidationError as err:
        if settings_made:  # the command's own, not the configuration's
            raise
        raise CliError(f"{path}: service: {first_problem(err)}", EXIT_USAGE) from None


@contextlib.asynccontextmanager
async def service_client(
    args: argparse.Namespace, *, needs: str = "api"
) -> AsyncIterator[ServiceClient]:
    """A started :class:`ServiceClient` for a command (see :func:`service_settings`), with the
    waiting line on a terminal while the command is in it."""
    from kiosk_agent.service.client import ServiceClient

    async with service_settings(args, needs=needs) as settings:
        where = settings.reporting_base if needs == "oauth" else settings.base_url
        async with (
            waiting(f"the service at {where}", settings.timeout),
            ServiceClient(settings) as svc,
        ):
            yield svc


def _note_address_origin(path: Path | None, values: dict[str, Any], needs: str) -> None:
    field = "reporting_url" if needs == "oauth" and values.get("reporting_url") else "base_url"
    variable = ENVIRONMENT[field]
    if os.environ.get(variable):
        SERVICE_ADDRESS_FROM["base_url"] = variable
        return
    if path is None or not values.get(field):
        return
    from kiosk_agent.config.load import locate
    from kiosk_agent.config.yaml_loader import load_yaml

    raw, _errors = load_yaml(path)
    service = raw.get("service") if isinstance(raw, dict) else None
    if not isinstance(service, dict) or field not in service:
        SERVICE_ADDRESS_FROM["base_url"] = f"the service: section of {path}"
        return
    where = locate(raw, ["service", field], None)
    line = f":{where.line}" if where is not None and where.line else ""
    SERVICE_ADDRESS_FROM["base_url"] = f"service.{field} at {path}{line}"


def _settings(
    values: dict[str, Any], needs: str, timeout: float | None, path: Path | None = None
) -> ServiceSettings:
    from pydantic import ValidationError

    from kiosk_agent.service.settings import ServiceSettings

    if "base_url" not in values and "reporting_url" in values:
        values["base_url"] = values["reporting_url"]
    required = ["base_url", "api_key", "mid"] if needs == "api" else [
        "base_url", "client_id", "client_secret"
    ]
    missing_fields = [field for field in required if not values.get(field)]
    missing = [ENVIRONMENT[field] for field in missing_fields]
    if missing and path is not None:  # a configuration was given: name what it lacks
        raise CliError(
            f"no service credentials: the service: section of {path} has no "
            f"{', '.join(missing_fields)}; add it there, or set {', '.join(missing)}",
            EXIT_USAGE,
        )
    if missing:
        raise CliError(
            f"no service credentials: set {', '.join(missing)} in the environment, or give "
            f"-c/--config FILE (or ${CONFIG_ENV}) with a service: section",
            EXIT_USAGE,
        )
    if isinstance(values.get("isv"), str):
        values["isv"] = values["isv"].strip().lower() in ("1", "true", "yes", "y")
    if timeout is not None:
        # --timeout is the service client's own bound on one call, retries and 429 waits
        # included (ServiceSettings.timeout; the timeouts of each kind of call derive from it).
        values["timeout"] = timeout
    try:
        return ServiceSettings(**values)
    except ValidationError as err:
        first = err.errors(include_input=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise CliError(f"service setting {field!r}: {first_problem(err)}", EXIT_USAGE) from None


def _plain_settings(settings: ServiceSettings) -> dict[str, Any]:
    from pydantic import SecretStr

    # By the names the settings take (``mid``), so KIOSK_* variables override them one for one.
    given = settings.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)
    return {
        name: value.get_secret_value() if isinstance(value, SecretStr) else value
        for name, value in given.items()
    }
