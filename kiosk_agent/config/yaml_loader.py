"""Reading a configuration's YAML: positions, ``!secret``/``!env_var``/``!include``, and bounds.

A configuration is outside input (a tech edits it, a script writes it, an include can point
anywhere), so reading it is bounded and confined:

- each file is at most :data:`MAX_FILE_BYTES`, and all the files of one configuration together
  (an include counted each time) at most :data:`MAX_TOTAL_BYTES`, checked before reading;
- mappings and lists nest at most :data:`MAX_DEPTH` deep, and anchors/aliases may expand to at
  most :data:`MAX_VALUES` values (a 458-byte "billion laughs" file would expand to 387 million);
- ``!include`` stays inside the configuration's directory (symlinks resolved), never reads the
  secrets file, and a cycle of includes is an error naming the chain;
- ``!secret`` reads ``secrets.yaml`` beside the main file only when group and others cannot
  read it, checked on the open file;
- an error names the file, line and column and what is wrong, and never quotes a file's
  contents (PyYAML's own messages quote the offending line; they are rewritten here).

Every mapping and list keeps the file and line of each of its entries, so validation can say
``config.yaml:14: triggers[1].price: ...``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from kiosk_agent.data_class import data_class

SECRETS_FILE = "secrets.yaml"

MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 1024 * 1024
MAX_INCLUDES = 100
MAX_DEPTH = 64
MAX_VALUES = 100_000

# difflib's default (0.6) calls 'path' close to 'health'; at 0.75 'admn' -> 'admin',
# 'pth' -> 'path' and 'prise' -> 'price' still match.
SUGGEST_CUTOFF = 0.75


def suggest(word: str, choices: Iterable[str]) -> str | None:
    """The choice a misspelt ``word`` most likely meant, or None when none is close enough."""
    by_lower = {str(c).lower(): str(c) for c in choices}
    import difflib  # only for a mistake; its import costs a Pi Zero a third of a second

    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=SUGGEST_CUTOFF)
    return by_lower[close[0]] if close else None


# --------------------------------------------------------------------------- errors


@data_class(frozen=True, slots=True)
class ConfigError:
    """One mistake in a configuration, located and explained."""

    file: str
    line: int | None
    path: str  # key path like "triggers[1].price"; "" for the whole file
    message: str
    fix: str | None = None
    column: int | None = None  # 1-based; given for YAML syntax errors

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        key = f" {self.path}:" if self.path else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        # names come from the file: no control character (a terminal escape) reaches a screen
        return f"{where}:{key} {self.message}{fix}".translate(_CONTROLS)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json`` output: every field, None where unknown."""
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
        }


_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}


class ConfigInvalid(Exception):
    """Raised by ``load_config`` with every mistake found."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


# --------------------------------------------------------------------------- loaded values


@data_class(frozen=True, slots=True)
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


class Unresolved(SecretValue):
    """What a failed !secret / !env_var / !include leaves behind: already reported, so the
    schema's complaint about the same key would only repeat the mistake."""

    __slots__ = ()


UNRESOLVED = Unresolved("")


# --------------------------------------------------------------------------- reading files


class _Refused(Exception):
    """A file that is not read; the message never quotes its contents."""


def _read_bounded(path: Path, limit: int) -> tuple[str, os.stat_result]:
    """The text of a regular file of at most ``limit`` bytes, and the stat of what was read.

    Opened without blocking (a FIFO would hang), checked on the open descriptor (no swap
    between the check and the read), refused before reading when too large.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise _Refused(f"cannot read {path}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(f"{path} is not a regular file")
        if info.st_size > limit:
            raise _Refused(
                f"{path} is {info.st_size:,} bytes; a configuration file may have at most {limit:,}"
            )
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while being read
            raise _Refused(f"{path} has more than {limit:,} bytes")
    except OSError as err:
        raise _Refused(f"cannot read {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8"), info
    except UnicodeDecodeError as err:
        raise _Refused(f"{path} is not UTF-8 text (byte {err.start + 1} cannot be read)") from None


# --------------------------------------------------------------------------- YAML syntax errors


# A parse error is explained by config/mistakes.py's syntax_error (imported when one is met).


def _unprintable(text: str, label: str) -> ConfigError | None:
    """A control character YAML does not allow (PyYAML's reader would raise on it)."""
    found = yaml.reader.Reader.NON_PRINTABLE.search(text)
    if found is None:
        return None
    before = text[: found.start()]
    line = before.count("\n") + 1
    column = found.start() - (before.rfind("\n") + 1) + 1
    return ConfigError(
        label,
        line,
        "",
        f"YAML syntax: a control character (U+{ord(found.group()):04X}) that YAML does not allow",
        "delete it, or write it as an escape (\\x1F) inside double quotes",
        column,
    )


# --------------------------------------------------------------------------- bounded YAML


class _Bounded(yaml.SafeLoader):
    """SafeLoader with nesting and alias-expansion bounds, and readable value errors."""

    budget: list[int]  # values left for the whole configuration (shared, so a list)
    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"mappings and lists nested more than {MAX_DEPTH} deep",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        self.budget[0] -= _expanded_size(node, self.budget[0])
        return self.construct_document(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError, TypeError):
            # e.g. a 5,000-digit integer or the date 2026-13-45
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "a number or date that cannot be read (too long or out of range)",
                node.start_mark,
            ) from None


class _ExpansionError(yaml.MarkedYAMLError):
    pass


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(root: yaml.Node, budget: int) -> int:
    """How many values ``root`` stands for once every alias is expanded, stopping past ``budget``.

    Iterative and memoized by node, so a file of shared aliases costs its node count to check.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size = 1 + sum(sizes[id(child)] for child in _children(node))
            sizes[key] = min(size, budget + 1)
            if size > budget:
                raise _ExpansionError(
                    None,
                    None,
                    f"anchors and aliases expand to more than {MAX_VALUES:,} values "
                    f"(an 'alias bomb')",
                    node.start_mark,
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _ExpansionError(
                None, None, "an alias refers to the list or mapping that holds it", node.start_mark
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)]


def _bounded_load(loader: _Bounded) -> Any:
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


B = TypeVar("B", bound=_Bounded)


class _PyYAMLReadsThis(yaml.YAMLError):
    """What libyaml reads otherwise than PyYAML: the file is read by PyYAML."""


def _on_libyaml(loader: type[B]) -> type[B]:
    """``loader`` reading its events from libyaml's parser (in C) where PyYAML was built with
    it: PyYAML's own reader, scanner and parser, in Python, were 4-5 ms of a start's 6 ms of
    reading its configuration (ten times that on a Pi Zero). The rest stays PyYAML's Python:
    the composer, so the nesting bound (``compose_node``) still holds, and the constructors.

    A file libyaml will not read is read again by PyYAML alone, whose error (or, where the two
    disagree, whose reading) is the one used: libyaml words its mistakes otherwise, and
    ``config.mistakes.syntax_error`` explains PyYAML's. So is a file with a value left out
    (`key:` and nothing after it: libyaml places the empty value where the next line starts,
    PyYAML after the key, and a mistake's line is the one PyYAML names), a file with a tab
    (libyaml takes tabs where PyYAML refuses them) and one with any character beyond ASCII (a
    byte order mark inside the text, Unicode's own line breaks: the two disagree on some).
    Nothing is constructed before that: no error, no secret, no include is looked at twice
    (``tests/config/test_config_properties.py`` holds the two readings to be alike)."""
    if not yaml.__with_libyaml__:
        return loader
    from yaml._yaml import CParser

    class OnLibyaml(CParser, loader):  # type: ignore[valid-type,misc]
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self.text = stream

        # the nodes are composed by PyYAML's composer (CParser's own would skip the bound)
        check_node = yaml.composer.Composer.check_node
        get_node = yaml.composer.Composer.get_node

        def compose_scalar_node(self, anchor: Any) -> Any:
            event: Any = self.peek_event()
            if event.value == "" and event.implicit[0]:  # a value left out: `key:`, `- `
                raise _PyYAMLReadsThis
            return super().compose_scalar_node(anchor)

        def get_single_node(self) -> Any:
            try:
                if "\t" in self.text or not self.text.isascii():
                    raise _PyYAMLReadsThis
                return yaml.composer.Composer.get_single_node(self)
            except yaml.YAMLError:
                again = loader(self.text)
                try:
                    return again.get_single_node()
                finally:
                    again.dispose()

    OnLibyaml.__name__ = OnLibyaml.__qualname__ = f"{loader.__name__}OnLibyaml"
    return OnLibyaml


# --------------------------------------------------------------------------- the configuration


class _Context:
    """What every file of one configuration shares: its directory, secrets, bounds, errors."""

    def __init__(self, main: Path) -> None:
        self.root = main.parent
        self.root_real = self.root.resolve()
        self.errors: list[ConfigError] = []
        self.budget = [MAX_VALUES]
        self.bytes_left = MAX_TOTAL_BYTES
        self.files_read = 0
        self.stack: list[Path] = []  # files being loaded, outermost first (resolved)
        self._secrets: dict[str, Any] | None = None
        self._secrets_error: str | None = None

    @property
    def secrets_path(self) -> Path:
        return self.root / SECRETS_FILE

    def label(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.root_real))
        except ValueError:
            return str(path)

    def error(self, where: Position, message: str, fix: str | None = None) -> None:
        self.errors.append(ConfigError(where.file, where.line, "", message, fix))

    # -- !secret

    def secret(self, name: str, where: Position) -> str | None:
        secrets = self._load_secrets()
        if secrets is None:
            fix = None
            if not self.secrets_path.exists():
                fix = f"create it with `{name}: ...` (see config/secrets.example.yaml), chmod 600"
            self.error(where, f"!secret {name}: {self._secrets_error}", fix)
            return None
        if name not in secrets:
            close = suggest(name, [str(k) for k in secrets])
            fix = f"did you mean !secret {close}?" if close else f"add `{name}: ...` to it"
            self.error(where, f"!secret {name}: not found in {self.secrets_path}", fix)
            return None
        value = secrets[name]
        if isinstance(value, (dict, list)) or value is None:
            self.error(
                where,
                f"!secret {name}: its value in {self.secrets_path} must be text or a number",
                f'write `{name}: "..."` in {SECRETS_FILE}',
            )
            return None
        return str(value)

    def _load_secrets(self) -> dict[str, Any] | None:
        if self._secrets is not None or self._secrets_error is not None:
            return self._secrets
        path = self.secrets_path
        if not path.exists():
            self._secrets_error = f"no secrets file at {path}"
            return None
        try:
            text, info = _read_bounded(path, MAX_FILE_BYTES)
        except _Refused as err:
            self._secrets_error = str(err)
            return None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            self._secrets_error = (
                f"{path} is readable by group or others (mode {stat.S_IMODE(info.st_mode):o}); "
                f"refusing to use it. Fix: chmod 600 {path}"
            )
            return None
        unprintable = _unprintable(text, SECRETS_FILE)
        if unprintable is not None:
            self._secrets_error = (
                f"{path} cannot be read at line {unprintable.line}, column "
                f"{unprintable.column}: {unprintable.message}"
            )
            return None
        loader = _SECRETS_LOADER(text)
        loader.budget = [MAX_VALUES]
        try:
            loaded = _bounded_load(loader)
        except yaml.MarkedYAMLError as err:
            from kiosk_agent.config.mistakes import syntax_error

            found = syntax_error(err, SECRETS_FILE, "")
            at = f"line {found.line}, column {found.column}" if found.line else "somewhere"
            self._secrets_error = f"{path} cannot be read at {at}: {found.message}"
            return None
        except (yaml.YAMLError, RecursionError):
            self._secrets_error = f"{path} cannot be read as YAML"
            return None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            self._secrets_error = f"{path} must be a mapping of name: value"
            return None
        self._secrets = loaded
        return loaded

    # -- files

    def load_file(self, path: Path, included_from: Position | None = None) -> Any:
        """Load one file of the configuration; mistakes go to :attr:`errors`, None is returned."""
        label = self.label(path) if included_from else path.name
        where = included_from or Position(label, 1)
        line = where.line if included_from else None
        self.files_read += 1
        if self.files_read > MAX_INCLUDES + 1:
            self.errors.append(
                ConfigError(where.file, line, "", f"more than {MAX_INCLUDES} includes")
            )
            return None
        try:
            text, info = _read_bounded(path, min(MAX_FILE_BYTES, max(self.bytes_left, 0)))
        except _Refused as err:
            message = str(err)
            if self.bytes_left < MAX_FILE_BYTES and "bytes" in message:
                message += f" (all files together: {MAX_TOTAL_BYTES:,})"
            self.errors.append(ConfigError(where.file, line, "", message))
            return None
        self.bytes_left -= info.st_size
        unprintable = _unprintable(text, label)
        if unprintable is not None:
            self.errors.append(unprintable)
            return None
        loader = _FILE_LOADER(text)
        loader.context = self
        loader.budget = self.budget
        loader.file_label = label
        loader.file_path = path
        self.stack.append(path.resolve())
        try:
            return _bounded_load(loader)
        except yaml.MarkedYAMLError as err:
            from kiosk_agent.config.mistakes import syntax_error

            self.errors.append(syntax_error(err, label, text))
            return None
        except yaml.YAMLError:
            self.errors.append(ConfigError(label, None, "", "YAML syntax: cannot be parsed"))
            return None
        except RecursionError:
            self.errors.append(ConfigError(label, None, "", "YAML: nested too deeply"))
            return None
        finally:
            self.stack.pop()

    def include(self, name: str, including: Path, where: Position) -> Any:
        """The data of ``!include name`` written in ``including``, or UNRESOLVED (reported)."""
        if not name or "\x00" in name:
            self.error(where, "!include needs a file name", "write `!include file.yaml`")
            return UNRESOLVED
        target = (including.parent / name).resolve()
        if not target.is_relative_to(self.root_real):
            self.error(
                where,
                f"!include {name}: outside the configuration directory {self.root_real}",
                "keep included files in the configuration's directory or below it",
            )
            return UNRESOLVED
        if target.name == SECRETS_FILE or _same_file(target, self.secrets_path):
            self.error(
                where,
                f"!include {name}: the secrets file cannot be included",
                "write `key: !secret name` for each value instead",
            )
            return UNRESOLVED
        if target in self.stack:
            chain = " -> ".join(self.label(p) for p in [*self.stack, target])
            self.error(where, f"!include {name}: include cycle {chain}", "remove one !include")
            return UNRESOLVED
        before = len(self.errors)
        loaded = self.load_file(target, where)
        if len(self.errors) > before:
            return UNRESOLVED
        if loaded is not None and not isinstance(loaded, (NodeDict, NodeList)):
            self.error(
                where,
                f"!include {name}: the file holds a single value, not a mapping or a list",
                "include YAML files of `key: value` lines or `- item` lines",
            )
            return UNRESOLVED
        return loaded


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


class _Loader(_Bounded):
    """The bounded loader that records positions and understands the three tags."""

    context: _Context
    file_label: str
    file_path: Path

    def position(self, node: yaml.Node) -> Position:
        return Position(self.file_label, node.start_mark.line + 1)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> NodeDict:
    own = {id(key_node) for key_node, _ in node.value}
    loader.flatten_mapping(node)  # merged (<<) pairs first, so the mapping's own keys win
    result = NodeDict()
    result.position = loader.position(node)
    own_keys: set[Any] = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        where = loader.position(key_node)
        try:
            hash(key)
        except TypeError:
            loader.context.error(
                where, "a list or mapping is used as a key", "keys are names, like `price:`"
            )
            continue
        if id(key_node) in own:
            if key in own_keys:
                loader.context.error(where, f"duplicate key {key!r}", "keep only one of them")
            own_keys.add(key)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_positions[key] = where
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> NodeList:
    result = NodeList(loader.construct_object(child, deep=True) for child in node.value)
    result.position = loader.position(node)
    result.item_positions = [loader.position(child) for child in node.value]
    return result


def _scalar(loader: _Loader, node: yaml.Node, tag: str) -> str | None:
    if not isinstance(node, yaml.ScalarNode):
        loader.context.error(
            loader.position(node), f"{tag} takes a single name, not a list or mapping"
        )
        return None
    return str(loader.construct_scalar(node)).strip()


def _construct_secret(loader: _Loader, node: yaml.Node) -> SecretValue:
    name = _scalar(loader, node, "!secret")
    if name is None:
        return UNRESOLVED
    value = loader.context.secret(name, loader.position(node))
    return UNRESOLVED if value is None else SecretValue(value)


def _construct_env_var(loader: _Loader, node: yaml.Node) -> SecretValue:
    if isinstance(node, yaml.SequenceNode):
        parts = [str(p) for p in loader.construct_sequence(node)]
    else:
        text = _scalar(loader, node, "!env_var")
        parts = text.split(None, 1) if text is not None else []
    if not parts:
        loader.context.error(loader.position(node), "!env_var needs a variable name")
        return UNRESOLVED
    name, default = parts[0], (parts[1] if len(parts) > 1 else None)
    value = os.environ.get(name, default) if "\x00" not in name else None
    if value is None:
        loader.context.error(
            loader.position(node),
            f"!env_var {name}: the environment variable is not set and no default is given",
            f"set {name} or write `!env_var {name} default`",
        )
        return UNRESOLVED
    return SecretValue(value)


def _construct_include(loader: _Loader, node: yaml.Node) -> Any:
    name = _scalar(loader, node, "!include")
    if name is None:
        return UNRESOLVED
    return loader.context.include(name, loader.file_path, loader.position(node))


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)
_Loader.add_constructor("!secret", _construct_secret)
_Loader.add_constructor("!env_var", _construct_env_var)
_Loader.add_constructor("!include", _construct_include)
# What reads each file (_Context.load_file) and the secrets file: on libyaml where it is built.
_FILE_LOADER = _on_libyaml(_Loader)
_SECRETS_LOADER = _on_libyaml(_Bounded)


def load_yaml(path: Path) -> tuple[Any, list[ConfigError]]:
    """Load a configuration file with positions; return the data and the loading mistakes."""
    context = _Context(path)
    data = context.load_file(path)
    return data, context.errors
