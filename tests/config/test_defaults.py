"""One setting, one default: a setting's default is written as a literal once in its package.

A section's schema (``vol.Optional("key", default=...)``) and the objects it configures (a
dataclass field, a keyword's default, an UPPER constant named like the setting, a
``conf.get("key", ...)``) share one name for it; two literals drift apart (``vend_timeout``
was 60 in the schema and 30 in a platform's class, ``answer_margin`` 10.0 three times).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

import kiosk_agent
from kiosk_agent.config.load import load_config

PACKAGE = Path(kiosk_agent.__file__).parent


def literal(node: ast.expr | None) -> object:
    """The number or text a default is written as, or None for a name, a call, True/False."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = literal(node.operand)
        return -value if isinstance(value, (int, float)) else None
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return None if isinstance(node.value, bool) else node.value
    return None


def schema_defaults(tree: ast.AST) -> list[tuple[str, int, object]]:
    """``vol.Optional("key", default=...)``: (key, line, the literal, or None for a name)."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "Optional" and node.args
                and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            for keyword in node.keywords:
                if keyword.arg == "default":
                    found.append((str(node.args[0].value), node.lineno, literal(keyword.value)))
    return found


def other_defaults(tree: ast.AST, settings: set[str]) -> list[tuple[str, int, object]]:
    """Every other literal default of a setting's name: a field, a keyword, a constant, a get."""
    found: list[tuple[str, int, object]] = []

    def add(name: str, line: int, node: ast.expr | None) -> None:
        if name in settings and literal(node) is not None:
            found.append((name, line, literal(node)))

    for node in getattr(tree, "body", []):  # a module's constants (an enum's members are not)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper():
                add(target.id.lower(), node.lineno, node.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            add(node.target.id, node.lineno, node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            positional = arguments.args[len(arguments.args) - len(arguments.defaults):]
            for arg, default in [*zip(positional, arguments.defaults, strict=True),
                                 *zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)]:
                add(arg.arg, node.lineno, default)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and len(node.args) == 2
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno, node.args[1])
    return found


def package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def doubles(files: dict[Path, str]) -> dict[tuple[str, str], list[str]]:
    """(package, setting) -> where its default is a literal, for each setting a package's schema
    declares and the package writes again (two sections' own keys, like admin's and webhooks'
    ``port``, are two settings: a schema's defaults are not compared with each other)."""
    trees: dict[Path, ast.AST] = {}

    def tree_of(path: Path) -> ast.AST:
        if path not in trees:
            trees[path] = ast.parse(files[path])
        return trees[path]

    # Only the files whose text names what is looked for are parsed (most name none of it):
    # parsing and walking every module was most of the test's CPU.
    declared: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path, text in files.items():
        if "Optional" not in text:  # a schema's default is written vol.Optional(key, default=)
            continue
        for key, line, value in schema_defaults(tree_of(path)):
            where = f"{path.relative_to(PACKAGE)}:{line} = {value!r}"
            places = declared[(package_of(path), key)]
            if value is not None:  # a name is the one default's: nothing written there
                places.append(where)
    again: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path, text in files.items():
        package = package_of(path)
        settings = {key for (owner, key) in declared if owner == package}
        if not any(key in text or key.upper() in text for key in settings):
            continue  # names none of its package's settings, in either spelling
        for key, line, value in other_defaults(tree_of(path), settings):
            again[(package, key)].append(f"{path.relative_to(PACKAGE)}:{line} = {value!r}")
    return {where: [*declared[where], *found] for where, found in again.items()
            if len(found) + min(1, len(declared[where])) > 1}


@pytest.fixture(scope="module")
def found() -> dict[tuple[str, str], list[str]]:
    return doubles({path: path.read_text() for path in PACKAGE.rglob("*.py")})


def test_no_setting_has_its_default_written_twice(
    found: dict[tuple[str, str], list[str]],
) -> None:
    twice = {f"{package}: {key}": places for (package, key), places in found.items()}
    assert not twice, twice


def test_the_check_finds_a_default_in_each_place_it_can_hide() -> None:
    code = {
        PACKAGE / "sales" / "schema_x.py":
            'S = vol.Schema({vol.Optional("vend_timeout", default=60.0): float,\n'
            '                vol.Optional("retries", default=RETRIES): int})\n',
        PACKAGE / "sales" / "flow_x.py":
            "VEND_TIMEOUT = 30.0\nRETRIES = 2\n"
            "class Step(enum.StrEnum):\n    VEND_TIMEOUT = 'vend.timeout'\n"  # a member, not one
            "class S:\n    vend_timeout: float = 30.0\n    retries: int = 3\n"
            "def f(*, vend_timeout=30.0, retries=RETRIES): conf.get('vend_timeout', 30.0)\n",
        PACKAGE / "web" / "x.py": "vend_timeout: float = 30.0\n",  # another package's own
    }  # fmt: skip
    found = doubles(code)
    assert sorted(found) == [("sales", "retries"), ("sales", "vend_timeout")]
    assert len(found[("sales", "vend_timeout")]) == 5
    assert len(found[("sales", "retries")]) == 2  # its schema names RETRIES: written twice else


def test_what_check_config_reads_is_the_owners_default(tmp_path: Path) -> None:
    from kiosk_agent.health import defaults as health
    from kiosk_agent.health.schema import HEALTH_SCHEMA
    from kiosk_agent.sales import settings as sales
    from kiosk_agent.web.server import HttpLimits

    path = tmp_path / "config.yaml"
    path.write_text("service: {simulator: {}}\nterminals: [{device_id: T1}]\n")
    config = load_config(path)
    assert config["sales"]["vend_timeout"] == sales.VEND_TIMEOUT
    assert config["sales"]["answer_margin"] == sales.ANSWER_MARGIN
    assert config["sales"]["stop_timeout"] == sales.STOP_TIMEOUT
    assert config["sales"]["attention_recheck"] == sales.ATTENTION_RECHECK
    assert HttpLimits.from_config(config["http"]) == HttpLimits.from_config(None)
    health_conf = HEALTH_SCHEMA({})
    assert health_conf["hold_off"] == health.HOLD_OFF
    assert health_conf["recheck_interval"] == health.RECHECK_INTERVAL
