"""A long-lived agent process after start: its models built, its start-up objects frozen.

The service's models are built on first use (``defer_build``), not at import: building the 26
a sale needs (those start-up has not used) takes some 25 ms of one core on a desktop, a quarter
of a second on a Pi Zero, and READY=1 need not wait for it. :func:`settle_after_ready` builds
them once the agent is ready, one per loop turn, so a sale that starts meanwhile is held up by
one build at most (it builds what it validates first, on demand, as any first use does).

Everything built before that (the imported modules, the configuration, the agent's wiring:
some 55,000 tracked objects) lives until the process ends. Left in the collector's oldest
generation, every full collection walks all of them: 10-14 ms of one core on a desktop machine,
ten times that on a Pi Zero, taken in the middle of whatever sale is running. ``gc.freeze()``
once start-up is over moves them to the permanent generation, which no collection scans; what
sales allocate afterwards is collected as before.

Collecting while they are made is wasted work too: each young-generation pass walks the
start-up objects made since the last one, all of which live for the whole run. ``kiosk-agent
run`` therefore pauses the collector (:func:`pause_for_start_up`), once its configuration is
loaded (:func:`collecting_while_loading`: the libraries' import garbage), until the freeze, which
collects once and resumes it: 20-30 ms less of one core before READY=1 on a desktop machine
(bench/agent.py: 0.145-0.148 -> 0.122-0.128 s above the library floor's CPU), at the cost of
about 0.5 MB more idle RSS (start-up's cyclic garbage is freed at the freeze, not reused while
start-up still allocates). Before the freeze, what start-up's one-time work left in the
standard library's caches is let go (:func:`shed_start_up_caches`).

That garbage and those caches are let go *before* the models are built, not after
(:func:`collect_start_up_garbage`): Python's small objects live in 1 MiB arenas, every page of
which an idle agent has touched, and what is freed becomes room for the next allocations. Freed
after the builds, start-up's 0.5 MB of garbage left holes that nothing filled, while the builds
had taken a 23rd arena; freed before them, the builds fill the holes (22 arenas at idle,
0.1-0.4 MB less RSS: docs/architecture.md, "Idle memory: fifth round"). The freeze then collects
only what was made since (the builds' own garbage), not the whole heap again.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pydantic import BaseModel

_LOGGER = logging.getLogger(__name__)

# While the configuration loads (collecting_while_loading): a young collection every this many
# net allocations (Python's default is 700), and no older generation's before this many of them
LOAD_YOUNG_THRESHOLD = 5000
LOAD_YOUNG_PASSES = 1000

_frozen = False
_collected = False  # start-up's garbage collected ahead of the freeze (collect_start_up_garbage)
_shed = False  # start-up's caches let go (shed_start_up_caches): once a process is enough


# The areas whose models a sale validates (a card read, a charge, a void or refund): built
# after READY=1 so the first customer does not wait for them. Others (reporting's rows, the
# health snapshot, boarding) are built by their first use, off any sale's path.
SALE_MODELS = (
    "kiosk_agent.service.models.common",
    "kiosk_agent.service.models.payments",
    "kiosk_agent.service.models.terminal",
)


def deferred_models(modules: tuple[str, ...] = SALE_MODELS) -> list[type[BaseModel]]:
    """The models of ``modules`` imported so far whose validators are not built yet."""
    from pydantic import BaseModel  # here: `kiosk-agent run` pauses the collector before it

    found: list[type[BaseModel]] = []
    pending = list(BaseModel.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if model.__module__ in modules and not model.__pydantic_complete__:
            found.append(model)
    return sorted(set(found), key=lambda m: (m.__module__, m.__qualname__))


class Settling:
    """What :func:`settle_after_ready` did: the models it built, and those it could not."""

    def __init__(self) -> None:
        self.built = 0
        self.errors = 0  # a model that cannot be built is a bug: counted, shown in health
        self.done = asyncio.Event()  # every model built (or counted) and start-up frozen


async def settle_after_ready(
    settling: Settling | None = None, modules: tuple[str, ...] = SALE_MODELS
) -> Settling:
    """Let go of start-up's caches and garbage, build the sale's deferred models, then freeze
    what start-up left (and resume the collector: also when the agent stops before the models
    are built); each its own loop turn, so a sale that arrives meanwhile waits for one of them
    (the collection, one walk of every object start-up made, is the longest)."""
    settling = settling or Settling()
    try:
        if not (_frozen or _collected):
            shed_start_up_caches()
            await asyncio.sleep(0)
        collect_start_up_garbage()  # first: the builds below reuse the room it frees
        await asyncio.sleep(0)
        for model in deferred_models(modules):
            try:
                if not model.__pydantic_complete__:  # a sale may have built it meanwhile
                    model.model_rebuild()
                    settling.built += 1
            except Exception:
                settling.errors += 1
                _LOGGER.exception("model %s could not be built", model.__qualname__)
            await asyncio.sleep(0)
    finally:
        freeze_start_up_objects()
    settling.done.set()
    return settling


@contextlib.contextmanager
def collecting_while_loading() -> Iterator[None]:
    """Young collections only while the configuration loads, then the start-up pause.

    The load imports the libraries (aiohttp, pydantic, attrs ...), which make garbage as they
    import: the classes attrs and dataclasses make twice (42 of them aiohttp's), ``http``'s
    enums, pydantic's decorator records; and the load's own schemas, built for it and dropped
    after it. Paused from the start, that garbage (some 0.3 MB) stayed until after READY=1 while
    the agent's own imports took new room beside it; collected here, they fill its room. A young
    pass every :data:`LOAD_YOUNG_THRESHOLD` allocations walks each object made meanwhile about
    once (none of the middle generation's walks, which Python's 700 would add every tenth
    pass), and the last pass, at the end, takes what the load dropped. The source lines attrs
    put in ``linecache`` for each method it generated (aiohttp's classes, some 100 KiB) go too,
    read only by a traceback's print, which reads the files again."""
    import linecache

    thresholds = gc.get_threshold()
    gc.set_threshold(LOAD_YOUNG_THRESHOLD, LOAD_YOUNG_PASSES, LOAD_YOUNG_PASSES)
    gc.enable()
    try:
        yield
        linecache.clearcache()
        gc.collect(0)
    finally:
        gc.set_threshold(*thresholds)
        pause_for_start_up()


def pause_for_start_up() -> None:
    """No collection until :func:`freeze_start_up_objects`: what start-up makes lives for the
    whole run (the caller resumes the collector itself should the run end before that)."""
    gc.disable()


def collect_start_up_garbage() -> None:
    """Let go of start-up's garbage and caches now, once a process and before the freeze, so
    that what is still made before it (the models built after READY=1) takes the room they
    leave instead of new memory. The collector stays as it is (paused by a run)."""
    global _collected
    if _frozen or _collected:
        return
    _collected = True
    if not _shed:
        shed_start_up_caches()
    gc.collect()


def freeze_start_up_objects() -> bool:
    """Freeze what exists now, once a process (a second agent in the same process, as in the
    tests, must not freeze the first one's garbage), and resume a paused collector. True when
    this call froze."""
    global _frozen
    if _frozen:
        gc.enable()
        return False
    _frozen = True
    if _collected:
        # only what was made since start-up's garbage went (young generations: a paused
        # collector leaves every new object there); the rest was walked once already
        gc.collect(1)
    else:
        shed_start_up_caches()
        gc.collect()  # the start-up garbage goes now, not into the permanent generation
    gc.freeze()
    gc.enable()
    return True


def shed_start_up_caches() -> None:
    """Let go of what start-up's one-time work left in the standard library's caches, which
    a freeze would keep for the whole run: the annotations evaluated while the models and
    dataclasses were made (typing's caches of the aliases they built), the patterns compiled
    through ``re``'s functions while the configuration was checked, every ABC's record of the
    classes it was asked about (pydantic asks of each annotation), and the source lines
    ``linecache`` holds of methods generated at import (attrs registers each one's source there,
    for tracebacks). Some 0.26 MB of an idle agent's heap; what a sale uses again is made again
    on that first use, once (a pattern compiled, a class looked up in an ABC)."""
    import abc
    import linecache
    import re
    import typing

    global _shed
    _shed = True
    re.purge()
    for clear in getattr(typing, "_cleanups", ()):  # each of typing's functools caches
        clear()
    linecache.clearcache()
    pending: list[type] = [object]
    seen: set[type] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if isinstance(cls, abc.ABCMeta):
            cls._abc_caches_clear()  # type: ignore[attr-defined]
        pending.extend(type.__subclasses__(cls))
