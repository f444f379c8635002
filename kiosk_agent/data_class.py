"""``data_class``: :func:`dataclasses.dataclass`, made for less CPU at import.

Python 3.11 writes each method a dataclass generates as source text and compiles it, at every
start: ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and, frozen, ``__setattr__`` and
``__delattr__``. Some 40 dataclasses on the way to a run's READY=1 spent 57-68 ms of one core
making their classes on the shared 2-core machine (about 1.5 ms each; ten times that on a Pi
Zero), a quarter of it compiling ``__repr__``, ``__eq__`` and ``__hash__``. Here those three are
closures over one function each, written once in this module, over the class's fields: the same
results as the generated ones (the same text, the same comparison of field tuples, the same
hash), made without compiling. So are a frozen class's guards, ``__setattr__`` and
``__delattr__`` (the same test and errors as the dataclass's, where Python's dataclasses make
them from text: 3.11 and 3.12); ``__init__`` is still the dataclass's own.

Used by the modules a ``kiosk-agent run`` imports before READY=1; elsewhere plain
``dataclasses.dataclass`` is as good. The class is a dataclass in every other way
(``fields``, ``replace``, ``asdict``; mypy reads it as one through ``dataclass_transform``).
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")


@overload
def data_class(cls: type[T], /) -> type[T]: ...


@overload
def data_class(
    *, frozen: bool = False, slots: bool = False, eq: bool = True, repr: bool = True
) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def data_class(
    cls: type[T] | None = None,
    /,
    *,
    frozen: bool = False,
    slots: bool = False,
    eq: bool = True,
    repr: bool = True,
) -> type[T] | Callable[[type[T]], type[T]]:
    """``@dataclass`` (bare, or with ``frozen``, ``slots``, ``eq``, ``repr``), its ``__repr__``,
    ``__eq__`` and ``__hash__`` made without compiling (see the module's docstring)."""

    def wrap(cls: type[T]) -> type[T]:
        return _made(cls, frozen=frozen, slots=slots, eq=eq, repr=repr)

    return wrap if cls is None else wrap(cls)


def _made(cls: type[T], *, frozen: bool, slots: bool, eq: bool, repr: bool) -> type[T]:
    own = cls.__dict__
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    keep = {name for name in ("__repr__", "__eq__") if name in own}
    made: Any = _dataclass(cls, frozen=frozen, slots=slots)
    fields = dataclasses.fields(made)
    if repr and "__repr__" not in keep:
        made.__repr__ = _repr_of([f.name for f in fields if f.repr])
    if eq and "__eq__" not in keep:
        compared = _values_of([f.name for f in fields if f.compare])
        made.__eq__ = _eq_of(compared)
        if not explicit_hash:  # dataclass's rule: frozen hashes its fields, mutable is unhashable
            hashed = [f.name for f in fields if f.hash or (f.hash is None and f.compare)]
            made.__hash__ = _hash_of(_values_of(hashed)) if frozen else None
    return made  # type: ignore[no-any-return]


# dataclasses' maker of the frozen guards, where it takes the module's globals (3.11, 3.12: it
# compiles the two from text); 3.13 writes them with its own builder, left as it is
_STDLIB_GUARDS = getattr(dataclasses, "_frozen_get_del_attr", None)
if _STDLIB_GUARDS is not None and _STDLIB_GUARDS.__code__.co_varnames[:3] != (
    "cls", "fields", "globals"
):
    _STDLIB_GUARDS = None


def _dataclass(cls: type[T], *, frozen: bool, slots: bool) -> type[T]:
    """``dataclasses.dataclass`` without ``__repr__`` and ``__eq__``, nor a docstring written
    for a class that has none (:func:`_undocumented`); a frozen class's guards made by
    :func:`_frozen_guards` (29 frozen classes on the way to READY=1: 58 compiles, some 13 ms of
    the start's CPU on the shared 2-core machine)."""
    make = dataclasses.dataclass(frozen=frozen, slots=slots, eq=False, repr=False)
    if not frozen or _STDLIB_GUARDS is None:
        return _undocumented(make, cls)
    dataclasses._frozen_get_del_attr = _frozen_guards  # type: ignore[attr-defined]
    try:
        return _undocumented(make, cls)
    finally:
        dataclasses._frozen_get_del_attr = _STDLIB_GUARDS  # type: ignore[attr-defined]


def _undocumented(make: Callable[[type[T]], type[T]], cls: type[T]) -> type[T]:
    """``make(cls)``, where a class with no docstring keeps none. dataclasses writes one for it
    from ``inspect.signature`` of the class (``Name(field: type, ...)``), read by ``help()``
    alone; under the unit's ``-OO`` no class has a docstring, so every dataclass on the way to
    READY=1 paid it: 40 signatures, 5-6 ms of the start's CPU on the shared 2-core machine."""
    if cls.__dict__.get("__doc__") is not None:
        return make(cls)
    cls.__doc__ = cls.__qualname__  # any text: dataclasses writes one only where there is none
    made = make(cls)
    made.__doc__ = None  # slots=True makes the class anew: cleared on the class returned
    return made


def _frozen_guards(cls: type, fields: list[dataclasses.Field[Any]], _globals: Any) -> tuple[
    Callable[[Any, str, Any], None], Callable[[Any, str], None]
]:
    """A frozen dataclass's ``__setattr__`` and ``__delattr__``: dataclasses' own test (the
    class itself, or one of its fields; ``cls`` the class as dataclasses passes it) and errors,
    as closures."""
    names = frozenset(f.name for f in fields)
    frozen_error = dataclasses.FrozenInstanceError

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise frozen_error(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)  # type: ignore[arg-type]

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise frozen_error(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)  # type: ignore[arg-type]

    return __setattr__, __delattr__


def _values_of(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of these attributes of an object (``attrgetter`` gives one name bare)."""
    if not names:
        return lambda _: ()
    get = attrgetter(*names)
    if len(names) == 1:
        return lambda obj: (get(obj),)
    return get


def _repr_of(names: list[str]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"

    return __repr__


def _eq_of(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash_of(values: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def maker_from(
    cls: type[T], source_fields: Sequence[str], given: Sequence[str] = ()
) -> Callable[..., T]:
    """A function ``(source, *given) -> cls`` for the write path: each of ``source_fields`` read
    off ``source`` by name, each of ``given`` from the arguments, in order, set in one straight
    function made once. A frozen dataclass's ``__init__`` parses keywords and calls
    ``object.__setattr__`` through a global a field (7.4 us for a sale's event against 2.7).
    Every field of ``cls`` must be named once: no default is filled in."""
    fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    named = [*source_fields, *given]
    if sorted(named) != sorted(fields) or any(name.startswith("_") for name in named):
        raise ValueError(f"{cls.__name__}: name every field once, got {', '.join(named)}")
    lines = [f"def _maker({', '.join(['_source', *given])}):", "    _made = _new(_cls)"]
    lines += [f"    _put(_made, {name!r}, _source.{name})" for name in source_fields]
    lines += [f"    _put(_made, {name!r}, {name})" for name in given]
    lines.append("    return _made")
    scope: dict[str, Any] = {"_new": object.__new__, "_put": object.__setattr__, "_cls": cls}
    exec("\n".join(lines), scope)  # noqa: S102 - names checked against the class's fields
    maker: Callable[..., T] = scope["_maker"]
    return maker
