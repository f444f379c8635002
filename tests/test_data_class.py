"""kiosk_agent.data_class: every shape the agent declares behaves as dataclasses' own does."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiosk_agent import data_class as data_class_module
from kiosk_agent.data_class import data_class, maker_from

OPTIONS: list[dict[str, bool]] = [
    {},
    {"slots": True},
    {"frozen": True},
    {"frozen": True, "slots": True},
    {"eq": False},
    {"repr": False},
    {"frozen": True, "eq": False},
]


def twins(options: dict[str, bool], body: Callable[[], type]) -> tuple[type, type]:
    """The same class body made by dataclasses.dataclass and by data_class."""
    return dataclasses.dataclass(**options)(body()), data_class(**options)(body())


def point() -> type:
    class Point:
        x: int
        y: Any = None
        hidden: str = dataclasses.field(default="h", repr=False)
        ignored: float = dataclasses.field(default=0.0, compare=False)
        tags: list[str] = dataclasses.field(default_factory=list, hash=False)

    return Point


def documented() -> type:
    class Documented:
        """Its own words."""

        value: int = 0

    return Documented


def single() -> type:
    class Single:
        value: Any

    return Single


def empty() -> type:
    class Empty:
        pass

    return Empty


VALUES = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.floats(allow_nan=True))


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@given(x=st.integers(-3, 3), y=VALUES, other_x=st.integers(-3, 3), other_y=VALUES,
       ignored=st.floats(allow_nan=False))  # fmt: skip
def test_repr_eq_and_hash_are_the_dataclasses_own(
    options: dict[str, bool], x: int, y: Any, other_x: int, other_y: Any, ignored: float
) -> None:
    theirs, ours = twins(options, point)
    a, b = theirs(x, y), theirs(other_x, other_y, ignored=ignored)
    c, d = ours(x, y), ours(other_x, other_y, ignored=ignored)
    assert (repr(c) == repr(a)) if options.get("repr", True) else "object at 0x" in repr(c)
    assert (c == d) == (a == b)
    assert (c == c) == (a == a)  # a NaN in y: the tuples compare by identity first, as theirs
    assert (c != d) == (a != b)
    assert c.__eq__(a) is NotImplemented  # another class, even of the same fields
    if not options.get("eq", True):
        assert hash(c) == object.__hash__(c)  # by identity, as theirs
    elif options.get("frozen"):
        assert hash(c) == hash(a)
    else:
        with pytest.raises(TypeError, match="unhashable"):
            hash(c)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("body", [single, empty])
def test_one_field_and_none_compare_and_hash_as_tuples(options: dict[str, bool], body: Any) -> None:
    theirs, ours = twins(options, body)
    arguments = [float("nan")] if body is single else []
    a, b, c, d = (theirs(*arguments), theirs(*arguments), ours(*arguments), ours(*arguments))
    assert (c == d) == (a == b)
    assert (c == c) == (a == a)
    if options.get("repr", True):
        assert repr(c) == repr(a)
    if options.get("frozen") and options.get("eq", True):
        assert hash(c) == hash(a)


def test_frozen_stays_frozen_and_slots_stay_slots() -> None:
    ours = data_class(frozen=True, slots=True)(point())
    record = ours(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.x = 2  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del record.x  # type: ignore[attr-defined]
    assert not hasattr(record, "__dict__")
    assert dataclasses.replace(record, x=3).x == 3  # type: ignore[attr-defined]
    assert copy.deepcopy(record) == record  # through __getstate__/__setstate__, as pickle


FROZEN = [options for options in OPTIONS if options.get("frozen")]


class Base:
    """A parent that writes attributes its own way: a frozen child's guard calls it."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, f"set {value}")


def frozen_child() -> type:
    class Child(Base):
        x: int

    return Child


@pytest.mark.parametrize("options", FROZEN, ids=str)
@pytest.mark.parametrize("body", [point, empty, frozen_child])
@pytest.mark.parametrize("name", ["x", "other", "__dict__"])
def test_frozen_guards_refuse_and_pass_as_the_dataclasses_own(
    options: dict[str, bool], body: Any, name: str
) -> None:
    """A frozen class's ``__setattr__`` and ``__delattr__`` are closures here, not compiled
    from text: the same outcome, error and words as dataclasses' own, on its fields, other
    names, a subclass's instance and a parent's own ``__setattr__``."""
    theirs, ours = twins(options, body)
    arguments = [] if body is empty else [1]
    for made in (theirs, ours):
        made.Sub = type("Sub", (made,), {})  # type: ignore[attr-defined]
    outcomes = []
    for made in (theirs, ours):
        said = []
        for record in (made(*arguments), made.Sub(*arguments)):  # type: ignore[attr-defined]
            for act in (lambda r: setattr(r, name, 5), lambda r: delattr(r, name)):
                try:
                    act(record)
                    said.append(("done", repr(getattr(record, name, None))))
                except Exception as err:  # the outcome compared, whatever it is
                    said.append((type(err).__name__, str(err)))
        outcomes.append(said)
    assert outcomes[0] == outcomes[1]


def test_a_frozen_class_compiles_its_init_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a frozen class's methods only ``__init__`` is compiled from text (dataclasses made
    its guards so too: 58 compiles for the 29 frozen classes on the way to READY=1)."""
    if data_class_module._STDLIB_GUARDS is None:
        pytest.skip("this Python's dataclasses write the guards with a builder of their own")
    guards = dataclasses._frozen_get_del_attr  # type: ignore[attr-defined]
    compiled: list[str] = []
    create = dataclasses._create_fn  # type: ignore[attr-defined]

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        compiled.append(name)
        return create(name, *args, **kwargs)

    monkeypatch.setattr(dataclasses, "_create_fn", counted)
    data_class(frozen=True, slots=True)(point())
    assert compiled == ["__init__"]
    assert dataclasses._frozen_get_del_attr is guards  # type: ignore[attr-defined]  # put back


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_a_class_with_no_docstring_is_made_without_reading_its_signature(
    options: dict[str, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """dataclasses writes a docstring from ``inspect.signature`` for a class with none, which
    under the unit's ``-OO`` is every class (40 signatures on the way to READY=1); here it keeps
    none, and a class's own docstring is kept as it is."""

    def read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("inspect.signature read while the class was made")

    monkeypatch.setattr(inspect, "signature", read)
    undocumented = data_class(**options)(point())
    assert undocumented.__doc__ is None
    assert undocumented(1).x == 1
    assert data_class(**options)(documented()).__doc__ == "Its own words."


def test_a_method_the_class_writes_itself_is_kept() -> None:
    def written() -> type:
        class Written:
            value: int

            def __repr__(self) -> str:
                return "mine"

            def __eq__(self, other: object) -> bool:
                return True

            def __hash__(self) -> int:
                return 7

        return Written

    for options in OPTIONS:
        theirs, ours = twins(options, written)
        assert repr(ours(1)) == repr(theirs(1)) == "mine"
        assert ours(1) == ours(2)
        assert hash(ours(1)) == hash(theirs(1)) == 7


def test_a_class_that_holds_itself_shows_the_dataclasses_ellipsis() -> None:
    theirs, ours = twins({}, single)
    a, c = theirs(None), ours(None)
    a.value, c.value = a, c
    assert repr(c) == repr(a)
    assert repr(c).endswith("Single(value=...)")


def test_the_agents_dataclasses_are_dataclasses() -> None:
    from kiosk_agent.sales.journal_records import SaleRecord

    assert dataclasses.is_dataclass(SaleRecord)
    names = [f.name for f in dataclasses.fields(SaleRecord)]
    assert names[:2] == ["sale_id", "order_id"]


def test_a_maker_makes_what_the_classs_own_init_makes() -> None:
    """maker_from: fields read off a source by name and given in order, as the frozen class's
    own __init__ would set them (equal, frozen, slotted); its default is not filled in."""
    made_by = data_class(frozen=True, slots=True)(point())
    source = made_by(3, "y", hidden="shown", ignored=1.5, tags=["a"])
    make = maker_from(made_by, ["x", "hidden", "tags"], ("y", "ignored"))
    made = make(source, "other", 2.5)
    assert made == made_by(3, "other", hidden="shown", ignored=2.5, tags=["a"])
    assert (made.ignored, made.hidden) == (2.5, "shown")  # compare=False and repr=False alike
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.x = 4
    assert not hasattr(made, "__dict__")


@pytest.mark.parametrize("named", [["x", "y", "hidden", "ignored"], ["x", "y", "hidden", "ignored",
                                   "tags", "x"], ["x", "y", "hidden", "ignored", "tags", "other"]])
def test_a_maker_names_every_field_once(named: list[str]) -> None:
    """A field left out (it would be missing), named twice or unknown is refused at once."""
    with pytest.raises(ValueError, match="name every field once"):
        maker_from(data_class(frozen=True)(point()), named)
