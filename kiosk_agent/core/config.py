"""The agent's YAML configuration: loader, core schema, and the errors a field tech can act on.

Home Assistant style: one YAML file, ``!secret name`` from ``secrets.yaml`` beside it,
``!env_var NAME [default]``, ``!include other.yaml``, validated by voluptuous. Every mapping
and list keeps the file and line of each of its entries, so a mistake is reported as
``config.yaml:14: triggers[1].price: expected an amount like "2.50", got 2.5`` rather than as a
traceback, and every mistake in the file is reported at once.
"""

from __future__ import annotations

import difflib
import importlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import voluptuous as vol
import yaml

from kiosk_agent.money import MoneyError, format_cents, parse_price

SECRETS_FILE = "secrets.yaml"

# Keys whose value must come from !secret or !env_var, never be written inline.
SECRET_KEYS = frozenset(
    {"api_key", "refresh_token", "client_secret", "token", "password", "secret", "isv_api_key"}
)

# Sections owned by other modules, imported by name when a config uses them, like the platform
# registry: core never imports admin or fleet code statically.
SECTION_OWNERS: dict[str, str] = {
    "admin": "kiosk_agent.admin.server",
    "webhooks": "kiosk_agent.admin.webhooks",
    "upstream": "kiosk_agent.core.upstream",
    "health": "kiosk_agent.core.health",
}


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True, slots=True)
class ConfigError:
    """One mistake in a configuration, located and explained."""

    file: str
    line: int | None
    path: str  # key path like "triggers[1].price"; "" for the whole file
    message: str
    fix: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        key = f" {self.path}:" if self.path else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{where}:{key} {self.message}{fix}"


class ConfigInvalid(Exception):
    """Raised by :func:`load_config` with every mistake found."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


# --------------------------------------------------------------------------- YAML with positions


@dataclass(frozen=True, slots=True)
class Position:
    file: str
    line: int  # 1-based


class NodeDict(dict[Any, Any]):
    """A mapping that remembers where it, and each of its keys, were written."""

    position: Position | None = None
    key_positions: dict[Any, Position]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.key_positions = {}


class NodeList(list[Any]):
    """A list that remembers where it, and each of its items, were written."""

    position: Position | None = None
    item_positions: list[Position]

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.item_positions = []


class SecretValue(str):
    """A value that came from !secret or !env_var: allowed under a secret key, masked in repr."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SecretValue('***')"


class _Unresolved(SecretValue):
    """What a failed !secret / !env_var / !include leaves behind: already reported, so the
    schema's complaint about the same key would only repeat the mistake."""

    __slots__ = ()


UNRESOLVED = _Unresolved("")


class _Context:
    """What every file of one configuration shares: its directory, secrets, and the errors."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.errors: list[ConfigError] = []
        self._secrets: dict[str, Any] | None = None
        self._secrets_error: str | None = None

    def secret(self, name: str, where: Position) -> str | None:
        secrets = self._load_secrets()
        if secrets is None:
            fix = None
            if not self.secrets_path.exists():
                fix = f"create it with `{name}: ...` (see config/secrets.example.yaml), chmod 600"
            self.error(where, f"!secret {name}: {self._secrets_error}", fix)
            return None
        if name not in secrets:
            close = difflib.get_close_matches(name, [str(k) for k in secrets], n=1)
            fix = f"did you mean !secret {close[0]}?" if close else f"add `{name}: ...` to it"
            self.error(where, f"!secret {name}: not found in {self.secrets_path}", fix)
            return None
        return str(secrets[name])

    @property
    def secrets_path(self) -> Path:
        return self.root / SECRETS_FILE

    def _load_secrets(self) -> dict[str, Any] | None:
        if self._secrets is not None or self._secrets_error is not None:
            return self._secrets
        path = self.secrets_path
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            self._secrets_error = f"no secrets file at {path}"
            return None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            self._secrets_error = (
                f"{path} is readable by group or others (mode {stat.S_IMODE(mode):o}); "
                f"refusing to use it. Fix: chmod 600 {path}"
            )
            return None
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as err:
            self._secrets_error = f"cannot read {path}: {err}"
            return None
        if not isinstance(loaded, dict):
            self._secrets_error = f"{path} must be a mapping of name: value"
            return None
        self._secrets = loaded
        return loaded

    def error(self, where: Position, message: str, fix: str | None = None) -> None:
        self.errors.append(ConfigError(where.file, where.line, "", message, fix))


class _Loader(yaml.SafeLoader):
    """SafeLoader that records positions and understands !secret, !env_var and !include."""

    context: _Context
    file_label: str
    file_path: Path

    def position(self, node: yaml.Node) -> Position:
        return Position(self.file_label, node.start_mark.line + 1)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> NodeDict:
    loader.flatten_mapping(node)
    result = NodeDict()
    result.position = loader.position(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        where = loader.position(key_node)
        if key in result:
            loader.context.error(where, f"duplicate key {key!r}", "keep only one of them")
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_positions[key] = where
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> NodeList:
    result = NodeList(loader.construct_object(child, deep=True) for child in node.value)
    result.position = loader.position(node)
    result.item_positions = [loader.position(child) for child in node.value]
    return result


def _construct_secret(loader: _Loader, node: yaml.Node) -> SecretValue:
    name = str(loader.construct_scalar(node)).strip()  # type: ignore[arg-type]
    value = loader.context.secret(name, loader.position(node))
    return UNRESOLVED if value is None else SecretValue(value)


def _construct_env_var(loader: _Loader, node: yaml.Node) -> SecretValue:
    if isinstance(node, yaml.SequenceNode):
        parts = [str(p) for p in loader.construct_sequence(node)]
    else:
        parts = str(loader.construct_scalar(node)).split(None, 1)  # type: ignore[arg-type]
    if not parts:
        loader.context.error(loader.position(node), "!env_var needs a variable name")
        return UNRESOLVED
    name, default = parts[0], (parts[1] if len(parts) > 1 else None)
    value = os.environ.get(name, default)
    if value is None:
        loader.context.error(
            loader.position(node),
            f"!env_var {name}: the environment variable is not set and no default is given",
            f"set {name} or write `!env_var {name} default`",
        )
        return UNRESOLVED
    return SecretValue(value)


def _construct_include(loader: _Loader, node: yaml.Node) -> Any:
    name = str(loader.construct_scalar(node)).strip()  # type: ignore[arg-type]
    target = (loader.file_path.parent / name).resolve()
    where = loader.position(node)
    if target == loader.file_path.resolve():
        loader.context.error(where, f"!include {name}: a file cannot include itself")
        return UNRESOLVED
    before = len(loader.context.errors)
    loaded = _load_file(target, loader.context, where)
    return UNRESOLVED if len(loader.context.errors) > before else loaded


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)
_Loader.add_constructor("!secret", _construct_secret)
_Loader.add_constructor("!env_var", _construct_env_var)
_Loader.add_constructor("!include", _construct_include)


def _load_file(path: Path, context: _Context, included_from: Position | None = None) -> Any:
    label = path.name if path.parent == context.root else str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        where = included_from or Position(label, 1)
        context.errors.append(
            ConfigError(
                where.file,
                where.line if included_from else None,
                "",
                f"cannot read {path}: {err.strerror}",
            )
        )
        return None
    loader = _Loader(text)
    loader.context = context
    loader.file_label = label
    loader.file_path = path
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        context.errors.append(ConfigError(label, line, "", f"YAML syntax: {err.problem or err}"))
        return None
    except yaml.YAMLError as err:
        context.errors.append(ConfigError(label, None, "", f"YAML: {err}"))
        return None
    finally:
        loader.dispose()


def load_yaml(path: Path) -> tuple[Any, list[ConfigError]]:
    """Load a configuration file with positions; return the data and the loading mistakes."""
    context = _Context(path.parent)
    data = _load_file(path, context)
    return data, context.errors


# --------------------------------------------------------------------------- validators


def price(value: Any) -> int:
    """A voluptuous validator: ``"2.50"`` or integer cents -> integer cents."""
    try:
        return parse_price(value)
    except MoneyError as err:
        raise vol.Invalid(str(err)) from None


def positive_price(value: Any) -> int:
    cents = price(value)
    if cents <= 0:
        raise vol.Invalid(f"expected an amount above zero, got {value!r}")
    return cents


def positive_float(value: Any) -> float:
    """Durations and scales (not money): a number above zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise vol.Invalid(f"expected a number, got {value!r}")
    if value <= 0:
        raise vol.Invalid(f"expected a number above zero, got {value!r}")
    return float(value)


def _flow(value: Any) -> str:
    from kiosk_agent.core.sale import Flow

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


# Every trigger has these; each platform extends it with its own keys.
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

SIMULATOR_SCHEMA = vol.Schema(
    {
        vol.Optional("time_scale", default=1.0): positive_float,
        vol.Optional("seed", default=1): int,
        vol.Optional("transactions", default=0): vol.All(int, vol.Range(min=0)),
    }
)

ENDPOINT_SCHEMA = vol.Schema(
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
            return {"simulator": SIMULATOR_SCHEMA(sim_conf)}
        except vol.MultipleInvalid as err:
            raise vol.MultipleInvalid([_prefixed(e, ["simulator"]) for e in err.errors]) from None
    return dict(ENDPOINT_SCHEMA(value))


def _prefixed(error: vol.Invalid, prefix: list[Any]) -> vol.Invalid:
    return type(error)(error.msg, path=prefix + list(error.path), error_message=error.error_message)


TERMINAL_SCHEMA = vol.Schema({vol.Required("device_id"): str, vol.Optional("name"): str})

JOURNAL_SCHEMA = vol.Schema(
    {
        vol.Optional("path", default="journal.db"): str,
        # Days of finished sales kept; open and attention sales are never pruned.
        vol.Optional("keep_days", default=400): vol.All(int, vol.Range(min=1)),
    }
)

RECEIPTS_SCHEMA = vol.Schema(
    {
        vol.Optional("print", default="auto"): vol.In(["auto", "always", "never"]),
        vol.Optional("email", default=True): bool,
    }
)

LOGGING_SCHEMA = vol.Schema(
    {
        vol.Optional("level", default="INFO"): vol.All(
            vol.Upper, vol.In(["DEBUG", "INFO", "WARNING", "ERROR"])
        ),
        vol.Optional("format", default="text"): vol.In(["text", "json"]),
        vol.Optional("file"): str,
    }
)

SALES_SCHEMA = vol.Schema(
    {
        # charge_card: how many times a B (retry) answer is asked again
        vol.Optional("retries", default=2): vol.All(int, vol.Range(min=0, max=10)),
        # how long a card may take at the terminal before the sale gives up (seconds)
        vol.Optional("card_timeout", default=200.0): positive_float,
        # authorize_capture: how long the machine may take to vend (seconds)
        vol.Optional("vend_timeout", default=60.0): positive_float,
        vol.Optional("currency", default="USD"): vol.All(str, vol.Length(min=3, max=3)),
        # the service's interaction lifetime (3 minutes); only a time-scaled service differs
        vol.Optional("interaction_lifetime"): positive_float,
        # on stop (SIGTERM), how long a running sale may take to finish before it is parked
        vol.Optional("stop_timeout", default=30.0): positive_float,
    }
)

# Limits of every local HTTP server (admin API, webhook receiver, kiosk API): one place.
HTTP_SCHEMA = vol.Schema(
    {
        # a new connection must send its first request's headers within this (seconds)
        vol.Optional("header_timeout", default=10.0): positive_float,
        # a request body must arrive whole within this (seconds)
        vol.Optional("body_timeout", default=30.0): positive_float,
        # an idle connection (or a slow next request) is closed after this (seconds)
        vol.Optional("keepalive_timeout", default=15.0): positive_float,
        # open connections per server; past it the oldest idle one is closed first
        vol.Optional("max_connections", default=256): vol.All(int, vol.Range(min=4, max=4096)),
        # how long a stop waits for requests in progress (seconds)
        vol.Optional("shutdown_grace", default=5.0): positive_float,
    }
)

CORE_SCHEMA = vol.Schema(
    {
        vol.Required("service"): _service,
        vol.Required("terminals"): vol.All([TERMINAL_SCHEMA], vol.Length(min=1)),
        vol.Optional("journal", default={}): JOURNAL_SCHEMA,
        vol.Optional("receipts", default={}): RECEIPTS_SCHEMA,
        vol.Optional("logging", default={}): LOGGING_SCHEMA,
        vol.Optional("sales", default={}): SALES_SCHEMA,
        vol.Optional("http", default={}): HTTP_SCHEMA,
        # each entry is checked by the registry against its platform's PLATFORM_SCHEMA
        vol.Optional("triggers", default=[]): [
            vol.Schema({vol.Required("platform"): str}, extra=vol.ALLOW_EXTRA)
        ],
    }
)

_SECTIONS: dict[str, vol.Schema] = {}


def register_section(key: str, schema: Callable[[Any], Any]) -> None:
    """Let a module outside core own a top-level section (admin, upstream, webhooks, health)."""
    if key in CORE_SCHEMA.schema or any(
        getattr(k, "schema", None) == key for k in CORE_SCHEMA.schema
    ):
        raise ValueError(f"section {key!r} belongs to the core schema")
    _SECTIONS[key] = schema if isinstance(schema, vol.Schema) else vol.Schema(schema)


def registered_sections() -> Mapping[str, vol.Schema]:
    return dict(_SECTIONS)


def _core_keys() -> list[str]:
    return [str(getattr(k, "schema", k)) for k in CORE_SCHEMA.schema]


# --------------------------------------------------------------------------- validation


@dataclass(slots=True)
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


def locate(data: Any, path: list[Any], default: Position | None) -> Position | None:
    """The deepest recorded position along ``path`` inside loaded YAML data."""
    where = getattr(data, "position", None) or default
    node = data
    for step in path:
        if isinstance(node, NodeDict):
            if step not in node:
                break
            where = node.key_positions.get(step, where)
            node = node[step]
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


def explain(
    error: vol.Invalid,
    data: Any,
    prefix: list[Any],
    default: Position | None,
    schema: Any = None,
) -> ConfigError:
    """Turn one voluptuous error into a located :class:`ConfigError` with a fix when obvious."""
    full_path = prefix + list(error.path)
    where = locate(data, full_path, default)
    message = error.msg
    fix: str | None = None
    last = error.path[-1] if error.path else None
    if message.startswith("extra keys not allowed"):
        message = f"unknown key {last!r}"
        known = _known_keys(list(error.path), schema) if schema is not None else []
        close = difflib.get_close_matches(str(last), known, n=1)
        if close:
            fix = f"did you mean {close[0]!r}?"
        elif known:
            fix = f"known keys: {', '.join(sorted(known))}"
    elif message.startswith("required key not provided"):
        message = f"required key {last!r} is missing"
        fix = f"add `{last}: ...`"
    elif (
        "expected an amount like" in message
        and "got" in message
        and isinstance(_value_at(data, full_path), float)
    ):
        fix = 'write the price in quotes, like "2.50", or as integer cents'
    elif message.startswith("expected str"):
        message = f"expected text, got {_value_at(data, full_path)!r}"
    elif message.startswith("expected int"):
        message = f"expected a whole number, got {_value_at(data, full_path)!r}"
    elif message.startswith("value must be one of"):
        message = f"{message}, got {_value_at(data, full_path)!r}"
    return ConfigError(
        where.file if where else "?",
        where.line if where else None,
        format_path(full_path),
        message,
        fix,
    )


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
    except vol.MultipleInvalid as err:
        found = err.errors
    except vol.Invalid as err:
        found = [err]
    return None, [
        explain(e, data, prefix, default, schema)
        for e in found
        if not isinstance(_value_at(data, prefix + list(e.path)), _Unresolved)
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
        importlib.import_module(owner)
    except ImportError as err:
        return f"section {key!r} is handled by {owner}, which cannot be imported: {err}"
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

    core_keys = set(_core_keys())
    core_part = {k: v for k, v in raw.items() if k in core_keys}
    result: dict[str, Any] = {}
    validated, core_errors = validate(CORE_SCHEMA, core_part, raw, [], top)
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
            close = difflib.get_close_matches(str(key), known, n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"known sections: {', '.join(known)}"
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
            close = difflib.get_close_matches(str(wanted), sorted(known), n=1)
            errors.append(
                _located(
                    raw,
                    ["triggers", index, "terminal"],
                    None,
                    f"unknown terminal {wanted!r}; configured: {', '.join(sorted(known))}",
                    f"did you mean {close[0]!r}?" if close else "add it under terminals:",
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
        from kiosk_agent.core.registry import validate_trigger

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
