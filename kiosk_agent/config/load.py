"""The agent's YAML configuration: core schema, validation, and the errors a field tech can act on.

Home Assistant style: one YAML file, ``!secret name`` from ``secrets.yaml`` beside it,
``!env_var NAME [default]``, ``!include other.yaml`` (read, bounded and confined by
:mod:`kiosk_agent.config.yaml_loader`), validated by voluptuous. Every mapping and list keeps the
file and line of each of its entries, so a mistake is reported as
``config.yaml:14: triggers[1].price: expected an amount like "2.50", got 2.5`` rather than as a
traceback, and every mistake in the file is reported at once: every item of a list and every
entry of a price map, not only the first one voluptuous stops at.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import voluptuous as vol

from kiosk_agent.config.yaml_loader import (
    SECRETS_FILE as SECRETS_FILE,
)
from kiosk_agent.config.yaml_loader import (
    ConfigError as ConfigError,
)
from kiosk_agent.config.yaml_loader import (
    ConfigInvalid as ConfigInvalid,
)
from kiosk_agent.config.yaml_loader import (
    NodeDict as NodeDict,
)
from kiosk_agent.config.yaml_loader import (
    NodeList as NodeList,
)
from kiosk_agent.config.yaml_loader import (
    Position as Position,
)
from kiosk_agent.config.yaml_loader import (
    SecretValue as SecretValue,
)
from kiosk_agent.config.yaml_loader import (
    Unresolved,
    suggest,
)
from kiosk_agent.config.yaml_loader import (
    load_yaml as load_yaml,
)
from kiosk_agent.data_class import data_class
from kiosk_agent.money import format_cents
from kiosk_agent.sales.schema import journal_schema, receipts_schema, sales_schema
from kiosk_agent.service.timeouts import DEFAULT_TIMEOUT
from kiosk_agent.validators import positive_float as positive_float
from kiosk_agent.validators import positive_price as positive_price
from kiosk_agent.validators import price as price
from kiosk_agent.validators import price_map as price_map
from kiosk_agent.web.schema import http_schema

if TYPE_CHECKING:
    from types import ModuleType

# Keys whose value must come from !secret or !env_var, never be written inline.
SECRET_KEYS = frozenset(
    {"api_key", "refresh_token", "client_secret", "token", "password", "secret", "isv_api_key"}
)



@data_class(frozen=True, slots=True)
class SectionOwner:
    """Where a section that another package owns lives, each part imported by name when a
    configuration has the section: the configuration, the assembly and the doctor import no
    admin, fleet or audit code statically."""

    schema: str  # registers the section (register_section): voluptuous alone, no server
    component: str | None = None  # "module:Class", built as Class(agent, conf) (app.py)
    checks: str | None = None  # registers the doctor's checks of it (doctor.register_check)


# The one table of those sections.
SECTION_OWNERS: dict[str, SectionOwner] = {
    "admin": SectionOwner("kiosk_agent.admin.schema", "kiosk_agent.admin.server:AdminServer"),
    "webhooks": SectionOwner(
        "kiosk_agent.admin.schema", "kiosk_agent.admin.webhooks:WebhookReceiver"
    ),
    "upstream": SectionOwner(
        "kiosk_agent.fleet.schema", "kiosk_agent.fleet.component:Upstream",
        checks="kiosk_agent.fleet.doctor",
    ),
    "health": SectionOwner("kiosk_agent.health.schema"),
    "dex": SectionOwner("kiosk_agent.audit.schema", "kiosk_agent.audit.component:AuditReads"),
}


# --------------------------------------------------------------------------- validators


def _flow(value: Any) -> str:
    from kiosk_agent.sales.model import Flow

    try:
        return Flow(value).value
    except ValueError:
        raise vol.Invalid(
            f"expected one of {', '.join(f.value for f in Flow)}, got {value!r}"
        ) from None


# The most a trigger may ask for unless its ``max_price`` says otherwise (MDB readers have one
# too): a vend request above it is denied, whatever the wire or the app said.
DEFAULT_MAX_PRICE_CENTS = 10_000


def _configured_prices(config: dict[str, Any], key: str) -> Iterator[tuple[list[Any], Any]]:
    """``max_funds``, ``buttons[].price`` (each item's) or ``products{}`` (each value)."""
    if key.endswith("[].price"):
        items = config.get(key[: -len("[].price")]) or []
        for index, item in enumerate(items):
            yield [key[: -len("[].price")], index, "price"], item.get("price")
    elif key.endswith("{}"):
        for name, value in (config.get(key[:-2]) or {}).items():
            yield [key[:-2], name], value
    else:
        yield [key], config.get(key)


def max_price_check(*prices: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A voluptuous step: the named configured prices may not exceed the trigger's max_price.

    Every price over it is reported, not only the first.
    """

    def check(config: dict[str, Any]) -> dict[str, Any]:
        limit = config["max_price"]
        errors = [
            vol.Invalid(f"{format_cents(value)} is above max_price {format_cents(limit)}", path)
            for key in prices
            for path, value in _configured_prices(config, key)
            if isinstance(value, int) and value > limit
        ]
        if errors:
            raise vol.MultipleInvalid(errors)
        return config

    return check


def no_enrollment(config: dict[str, Any]) -> dict[str, Any]:
    """A voluptuous step for a platform that cannot ask the customer's details (a button, a
    vending machine): the vault refuses a card saved without them, so ``flow: enroll`` would
    read every card and then fail. Refused here, before a customer meets it."""
    if config.get("flow") == "enroll":
        raise vol.Invalid(
            "enroll saves a card with the customer's details (name, billing address, e-mail, "
            "phone), which this platform cannot ask for: use it on kiosk_api, whose app sends "
            "them", path=["flow"],
        )
    return config


# What every trigger has; each platform extends it with its own keys. Kept at the top: it is
# the contract of a third-party platform (``PLATFORM_SCHEMA = load.PLATFORM_SCHEMA.extend``).
PLATFORM_SCHEMA = vol.Schema(
    {
        vol.Required("platform"): str,
        vol.Optional("name"): str,
        vol.Optional("terminal"): str,
        vol.Optional("flow", default="charge_card"): _flow,
        vol.Optional("max_price", default=DEFAULT_MAX_PRICE_CENTS): positive_price,
    },
    extra=vol.ALLOW_EXTRA,
)



def schema_built_on_read(module: str, build: Callable[[], Any]) -> Callable[[str], Any]:
    """A platform module's ``__getattr__`` (PEP 562) giving ``PLATFORM_SCHEMA``, the registry's
    contract, built by ``build`` on each read: a running agent checks its configuration once, at
    start, and a schema kept at the module's top stayed in an idle agent's heap for the whole
    run (docs/architecture.md, "Idle memory: the start's leftovers")."""
    return _BuiltOnRead(module, build)


class _BuiltOnRead:
    """What :func:`schema_built_on_read` gives: known by :func:`gives_platform_schema` as a
    module's promise of ``PLATFORM_SCHEMA``, without building it."""

    def __init__(self, module: str, build: Callable[[], Any]) -> None:
        self._module = module
        self._build = build

    def __call__(self, name: str) -> Any:
        if name == "PLATFORM_SCHEMA":
            return self._build()
        raise AttributeError(f"module {self._module!r} has no attribute {name!r}")


def gives_platform_schema(module: ModuleType) -> bool:
    """Whether ``module`` has a ``PLATFORM_SCHEMA``. One built on each read is not built to
    find out (``hasattr`` did, then threw it away: a schema built twice a trigger at every
    start); a third party's module is asked as any other."""
    own = vars(module)
    return (
        "PLATFORM_SCHEMA" in own
        or isinstance(own.get("__getattr__"), _BuiltOnRead)
        or hasattr(module, "PLATFORM_SCHEMA")
    )

# The schemas below are built by the function that checks with them, each time, not kept at the
# module's top: a running agent reads its configuration once, at start, and a module-level
# schema (with the sales', journal's and http sections' it holds) stayed in memory for the whole
# run, some 125 KiB of an idle agent's heap (docs/architecture.md, "Idle memory: the start's
# leftovers"). The load builds them once (3 ms of CPU on the 2-core machine), as the import did.
def _simulator_schema() -> vol.Schema:
    return vol.Schema(
        {
            vol.Optional("time_scale", default=1.0): positive_float,
            vol.Optional("seed", default=1): int,
            vol.Optional("transactions", default=0): vol.All(int, vol.Range(min=0)),
        }
    )


def _endpoint_schema() -> vol.Schema:
    return vol.Schema(
        {
            vol.Required("base_url"): vol.Url(),
            vol.Optional("reporting_url"): vol.Url(),
            vol.Optional("ws_url"): str,
            vol.Required("api_key"): str,
            vol.Optional("refresh_token"): str,
            vol.Required("mid"): vol.Coerce(str),
            vol.Optional("isv", default=False): bool,
            vol.Optional("client_id"): str,
            vol.Optional("client_secret"): str,
            vol.Optional("credentials_path"): str,
            # seconds one request may take in all (a money call's deadline starts from it)
            vol.Optional("timeout", default=DEFAULT_TIMEOUT): vol.All(
                positive_float, vol.Range(max=300)
            ),
        }
    )


def _service(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise vol.Invalid("expected a mapping with base_url and api_key, or simulator: {...}")
    if "simulator" in value:
        extra = sorted(str(k) for k in value if k != "simulator")
        if extra:
            raise vol.Invalid(
                f"simulator cannot be combined with {', '.join(extra)}",
                path=[extra[0]],
            )
        sim_conf = value["simulator"] if value["simulator"] is not None else {}
        try:
            return {"simulator": _simulator_schema()(sim_conf)}
        except vol.MultipleInvalid as err:
            raise vol.MultipleInvalid([_prefixed(e, ["simulator"]) for e in err.errors]) from None
    return dict(_endpoint_schema()(value))


def _prefixed(error: vol.Invalid, prefix: list[Any]) -> vol.Invalid:
    return type(error)(error.msg, path=prefix + list(error.path), error_message=error.error_message)


def core_schema() -> vol.Schema:
    """The sections core owns (:data:`CORE_SECTIONS`); the others are registered by their
    owners (:func:`register_section`)."""
    return vol.Schema(
        {
            vol.Required("service"): _service,
            vol.Required("terminals"): vol.All(
                [vol.Schema({vol.Required("device_id"): str, vol.Optional("name"): str})],
                vol.Length(min=1),
            ),
            vol.Optional("journal", default={}): journal_schema(),
            vol.Optional("receipts", default={}): receipts_schema(),
            vol.Optional("logging", default={}): vol.Schema(
                {
                    vol.Optional("level", default="INFO"): vol.All(
                        vol.Upper, vol.In(["DEBUG", "INFO", "WARNING", "ERROR"])
                    ),
                    vol.Optional("format", default="text"): vol.In(["text", "json"]),
                    vol.Optional("file"): str,
                }
            ),
            vol.Optional("sales", default={}): sales_schema(),
            vol.Optional("http", default={}): http_schema(),
            # each entry is checked by the registry against its platform's PLATFORM_SCHEMA
            vol.Optional("triggers", default=[]): [
                vol.Schema({vol.Required("platform"): str}, extra=vol.ALLOW_EXTRA)
            ],
        }
    )


# The top-level keys of core_schema(), in its order (tests/config/test_config.py holds them equal)
CORE_SECTIONS = (
    "service", "terminals", "journal", "receipts", "logging", "sales", "http", "triggers",
)

_SECTIONS: dict[str, vol.Schema] = {}


def register_section(key: str, schema: Callable[[Any], Any]) -> None:
    """Let a module outside core own a top-level section (admin, upstream, webhooks, health)."""
    if key in CORE_SECTIONS:
        raise ValueError(f"section {key!r} belongs to the core schema")
    _SECTIONS[key] = schema if isinstance(schema, vol.Schema) else vol.Schema(schema)


def registered_sections() -> Mapping[str, vol.Schema]:
    return dict(_SECTIONS)


# --------------------------------------------------------------------------- validation


@data_class(slots=True)
class Config:
    """A validated configuration."""

    path: Path
    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def triggers(self) -> list[dict[str, Any]]:
        return list(self.data.get("triggers", []))

    def resolve(self, relative: str) -> Path:
        """A path from the configuration, relative to the configuration's directory."""
        path = Path(relative).expanduser()
        return path if path.is_absolute() else self.path.parent / path

    def masked(self) -> dict[str, Any]:
        """The resolved configuration with every secret shown as ``***`` (for ``--show``)."""
        return dict(_masked(self.data))


def _masked(value: Any, key: Any = None) -> Any:
    if isinstance(value, SecretValue) or (str(key) in SECRET_KEYS and isinstance(value, str)):
        return "***"
    if isinstance(value, dict):
        return {k: _masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def locate(data: Any, path: list[Any], default: Position | None) -> Position | None:
    """The deepest recorded position along ``path`` inside loaded YAML data."""
    where = getattr(data, "position", None) or default
    node = data
    for index, step in enumerate(path):
        if isinstance(node, NodeDict):
            if step not in node:
                break
            where = node.key_positions.get(step, where)
            node = node[step]
            if index == len(path) - 1 and isinstance(node, (NodeDict, NodeList)):
                break  # a mistake about a whole block is on its key's line, not the next one
        elif isinstance(node, NodeList) and isinstance(step, int) and 0 <= step < len(node):
            where = node.item_positions[step]
            node = node[step]
        else:
            break
        where = getattr(node, "position", None) or where
        if not isinstance(node, (NodeDict, NodeList)):
            break
    return where


def format_path(path: list[Any]) -> str:
    text = ""
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
        else:
            text += f".{step}" if text else str(step)
    return text


def _unwrap(node: Any) -> Any:
    """The dict or list inside a voluptuous Schema/All, for walking a schema by key path."""
    while True:
        if isinstance(node, vol.Schema):
            node = node.schema
        elif isinstance(node, vol.All):
            node = next(
                (v for v in node.validators if isinstance(v, (dict, list, vol.Schema))), None
            )
        else:
            return node


def _known_keys(path: list[Any], schema: Any) -> list[str]:
    """Keys a schema accepts in the mapping holding ``path``'s last step (for 'did you mean')."""
    node = _unwrap(schema)
    for step in path[:-1]:
        if isinstance(node, dict):
            node = _unwrap(
                next((v for k, v in node.items() if getattr(k, "schema", k) == step), None)
            )
        elif isinstance(node, list) and isinstance(step, int) and node:
            node = _unwrap(node[0])
        else:
            return []
    if isinstance(node, dict):
        return [str(getattr(k, "schema", k)) for k in node]
    return []


def known_keys(schema: Any) -> set[str]:
    """The top-level keys a (possibly wrapped) voluptuous mapping schema names."""
    return set(_known_keys(["_"], schema))


def _value_at(data: Any, path: list[Any]) -> Any:
    node = data
    for step in path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def validate(
    schema: Callable[[Any], Any],
    value: Any,
    data: Any,
    prefix: list[Any],
    default: Position | None,
) -> tuple[Any, list[ConfigError]]:
    """Validate ``value`` (found at ``prefix`` inside ``data``) and explain every mistake."""
    try:
        return schema(value), []
    except vol.Invalid as err:
        from kiosk_agent.config.mistakes import every_invalid, explain

        found = every_invalid(schema, value, err)
    return None, [
        explain(e, data, prefix, default, schema)
        for e in found
        if not isinstance(_value_at(data, prefix + list(e.path)), Unresolved)
    ]


def _inline_secrets(node: Any, path: list[Any]) -> Iterator[tuple[list[Any], Position | None]]:
    if isinstance(node, NodeDict):
        for key, value in node.items():
            here = [*path, key]
            if (
                str(key) in SECRET_KEYS
                and isinstance(value, str)
                and not isinstance(value, SecretValue)
                and value
            ):
                yield here, node.key_positions.get(key)
            yield from _inline_secrets(value, here)
    elif isinstance(node, NodeList):
        for index, value in enumerate(node):
            yield from _inline_secrets(value, [*path, index])


def _import_section_owner(key: str) -> str | None:
    """Import the module that registers section ``key``; an error message if that fails."""
    owner = SECTION_OWNERS.get(key)
    if owner is None:
        return None
    try:
        importlib.import_module(owner.schema)
    except ImportError as err:
        return f"section {key!r} is handled by {owner.schema}, which cannot be imported: {err}"
    return None


def _validate_document(
    raw: Any,
    label: str,
    platform_validator: Callable[[int, Any], tuple[Any, list[ConfigError]]] | None,
) -> tuple[dict[str, Any], list[ConfigError]]:
    errors: list[ConfigError] = []
    top = Position(label, 1)
    if raw is None:
        return {}, [ConfigError(label, None, "", "the file is empty", "start with `service:`")]
    if not isinstance(raw, dict):
        return {}, [ConfigError(label, 1, "", "expected a mapping of sections at the top level")]

    for path, where in _inline_secrets(raw, []):
        key = path[-1]
        errors.append(
            ConfigError(
                where.file if where else label,
                where.line if where else None,
                format_path(path),
                "a secret is written inline in the configuration",
                f"move it to {SECRETS_FILE} (chmod 600) and write `{key}: !secret {key}`, "
                f"or use `!env_var NAME`",
            )
        )

    core_keys = set(CORE_SECTIONS)
    core_part = {k: v for k, v in raw.items() if k in core_keys}
    result: dict[str, Any] = {}
    validated, core_errors = validate(core_schema(), core_part, raw, [], top)
    errors.extend(core_errors)
    if validated is not None:
        result.update(validated)

    for key, value in raw.items():
        if key in core_keys:
            continue
        if key not in _SECTIONS:
            problem = _import_section_owner(str(key))
            if problem is not None:
                errors.append(_located(raw, [key], top, problem))
                continue
        schema = _SECTIONS.get(key)
        if schema is None:
            known = sorted(core_keys | set(_SECTIONS) | set(SECTION_OWNERS))
            close = suggest(str(key), known)
            fix = f"did you mean {close!r}?" if close else f"known sections: {', '.join(known)}"
            errors.append(_located(raw, [key], top, f"unknown section {key!r}", fix))
            continue
        section, section_errors = validate(
            schema, value if value is not None else {}, raw, [key], top
        )
        errors.extend(section_errors)
        result[key] = section

    triggers = raw.get("triggers") or []
    checked: list[Any] = []
    if platform_validator is not None and isinstance(triggers, list):
        for index, trigger in enumerate(triggers):
            if not isinstance(trigger, dict) or "platform" not in trigger:
                continue  # the core schema already said so
            value, trigger_errors = platform_validator(index, trigger)
            errors.extend(trigger_errors)
            checked.append(value)
        if not errors:
            result["triggers"] = checked
    errors.extend(_duplicate_names(result.get("triggers", []), raw))
    errors.extend(_unknown_terminals(result, raw))
    return result, errors


def _unknown_terminals(result: dict[str, Any], raw: Any) -> list[ConfigError]:
    """A trigger naming a terminal (by device id or name) that ``terminals`` does not list."""
    terminals = result.get("terminals") or []
    known = {t["device_id"] for t in terminals} | {t["name"] for t in terminals if t.get("name")}
    errors = []
    for index, trigger in enumerate(result.get("triggers") or []):
        wanted = trigger.get("terminal") if isinstance(trigger, dict) else None
        if terminals and wanted is not None and wanted not in known:
            close = suggest(str(wanted), sorted(known))
            errors.append(
                _located(
                    raw,
                    ["triggers", index, "terminal"],
                    None,
                    f"unknown terminal {wanted!r}; configured: {', '.join(sorted(known))}",
                    f"did you mean {close!r}?" if close else "add it under terminals:",
                )
            )
    return errors


def _duplicate_names(triggers: list[Any], raw: Any) -> list[ConfigError]:
    seen: dict[str, int] = {}
    errors = []
    for index, trigger in enumerate(triggers):
        if not isinstance(trigger, dict) or not trigger.get("name"):
            continue
        name = trigger["name"]
        if name in seen:
            errors.append(
                _located(
                    raw,
                    ["triggers", index, "name"],
                    None,
                    f"name {name!r} is already used by triggers[{seen[name]}]",
                    "give every trigger its own name",
                )
            )
        seen[name] = index
    return errors


def _located(
    raw: Any, path: list[Any], default: Position | None, message: str, fix: str | None = None
) -> ConfigError:
    where = locate(raw, path, default)
    return ConfigError(
        where.file if where else "?", where.line if where else None, format_path(path), message, fix
    )


def load_config(path: str | Path, *, check_platforms: bool = True) -> Config:
    """Load and validate a configuration; raise :class:`ConfigInvalid` with every mistake."""
    config_path = Path(path)
    raw, errors = load_yaml(config_path)
    validator = None
    if check_platforms:
        from kiosk_agent.config.registry import validate_trigger

        def validator(index: int, trigger: Any) -> tuple[Any, list[ConfigError]]:
            value, errors = validate_trigger(trigger, raw, ["triggers", index])
            return value, errors

    if raw is None and errors:
        raise ConfigInvalid(errors)
    data, validation_errors = _validate_document(raw, config_path.name, validator)
    errors.extend(validation_errors)
    if errors:
        raise ConfigInvalid(_sorted(errors))
    return Config(config_path, data)


def _sorted(errors: list[ConfigError]) -> list[ConfigError]:
    unique = list(dict.fromkeys(errors))
    return sorted(unique, key=lambda e: (e.file, e.line or 0, e.path))


def check_config(path: str | Path) -> list[ConfigError]:
    """Every mistake in a configuration, without starting anything; empty when it is valid."""
    try:
        load_config(path)
    except ConfigInvalid as err:
        return err.errors
    return []
