"""A long-lived agent after start: its deferred models built after READY=1, then start-up's
objects frozen once, its garbage freed first."""

from __future__ import annotations

import asyncio
import gc
import linecache
import subprocess
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, create_model

from kiosk_agent.assembly import collector


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if no agent had started in this process yet; what the test froze is given back."""
    monkeypatch.setattr(collector, "_frozen", False)
    monkeypatch.setattr(collector, "_collected", False)
    monkeypatch.setattr(collector, "_shed", False)
    frozen_before = gc.get_freeze_count()
    yield
    if frozen_before == 0:
        gc.unfreeze()


@pytest.mark.usefixtures("fresh_process")
def test_start_up_objects_leave_the_collectors_sight_once_per_process() -> None:
    kept = [Node() for _ in range(100)]
    assert collector.freeze_start_up_objects()
    frozen = gc.get_freeze_count()
    assert frozen >= len(kept)  # a full collection no longer walks them
    assert not collector.freeze_start_up_objects()  # a second agent: its garbage stays collectable
    # not more: a second freeze would add every object made since. (Fewer may be: a frozen
    # object is still freed when its last reference goes, and the suite's other tests run here.)
    assert gc.get_freeze_count() <= frozen


@pytest.mark.usefixtures("fresh_process")
def test_start_up_garbage_is_freed_not_frozen() -> None:
    gc.disable()  # only the freeze may collect it
    try:
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        assert gone() is not None
        collector.freeze_start_up_objects()
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.usefixtures("fresh_process")
def test_garbage_made_after_start_ups_was_collected_is_freed_by_the_freeze_not_frozen() -> None:
    gc.disable()  # as `kiosk-agent run` holds it until the freeze
    try:
        start_up_garbage = Node()
        start_up_gone = weakref.ref(start_up_garbage)
        del start_up_garbage
        collector.collect_start_up_garbage()
        assert start_up_gone() is None
        later = Node()  # made between the two, as the models built after READY=1 make theirs
        later_gone = weakref.ref(later)
        del later
        assert collector.freeze_start_up_objects()
        assert later_gone() is None
    finally:
        gc.enable()


# apart from the agent's: its settling never sees them
TEST_MODELS = "tests.assembly.collector_models"
BROKEN_MODELS = "tests.assembly.collector_models_broken"


def _deferred_model(name: str, annotation: str, module: str = TEST_MODELS) -> type[BaseModel]:
    """A project model as the service's are made: built on first use, not when defined."""
    model = create_model(
        name, __config__=ConfigDict(defer_build=True), __module__=module,
        field=(annotation, ...),
    )
    assert not model.__pydantic_complete__
    return model


@pytest.mark.usefixtures("fresh_process")
async def test_after_ready_every_deferred_model_is_built_one_per_loop_turn() -> None:
    models = [_deferred_model(f"Deferred{n}", "int") for n in range(5)]
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    try:
        settling = await collector.settle_after_ready(modules=(TEST_MODELS,))
    finally:
        counter.cancel()
    assert all(model.__pydantic_complete__ for model in models)
    assert settling.built >= len(models)
    assert turns >= len(models)  # a sale starting meanwhile waits for one build, not all
    assert settling.done.is_set()
    assert gc.get_freeze_count() > 0  # then start-up is frozen
    assert models[0].model_validate({"field": "3"}).field == 3  # type: ignore[attr-defined]


@pytest.mark.usefixtures("fresh_process")
async def test_start_ups_garbage_is_freed_before_the_first_model_is_built() -> None:
    """What start-up leaves is freed ahead of the builds, so that they reuse its room instead of
    taking new memory (a 23rd arena of Python's heap, at idle, in the bench's agent)."""
    models = [_deferred_model(f"BuiltAfterGarbage{n}", "int") for n in range(2)]
    collector.pause_for_start_up()
    try:
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        settling = asyncio.create_task(collector.settle_after_ready(modules=(TEST_MODELS,)))
        for _turn in range(3):  # the caches let go, the garbage collected, the first model
            await asyncio.sleep(0)
        assert not settling.done()
        assert gone() is None
        assert models[0].__pydantic_complete__  # built into the room it left
        await settling
        assert models[1].__pydantic_complete__
    finally:
        gc.enable()


@pytest.mark.usefixtures("fresh_process")
async def test_settling_takes_a_loop_turn_for_each_of_its_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Right after READY=1 the caches were let go, start-up's garbage collected and the first
    model built in one turn of the loop, and the last model, the freeze, the WAL grown and the
    prune's start in another: a sale arriving then waited for all of them (0.11-0.17 s on a
    quiet machine). Each is its own turn now; the collection (one walk of every object start-up
    made) is the longest."""
    models = [_deferred_model(f"Stepped{n}", "int") for n in range(3)]
    turn = 0
    steps: list[tuple[str, int]] = []

    def at_turn(name: str, real: Any) -> Any:
        def step(*args: Any, **kwargs: Any) -> Any:
            steps.append((name, turn))
            return real(*args, **kwargs)
        return step

    for name in ("shed_start_up_caches", "collect_start_up_garbage", "freeze_start_up_objects"):
        monkeypatch.setattr(collector, name, at_turn(name, getattr(collector, name)))
    for model in models:
        monkeypatch.setattr(model, "model_rebuild", at_turn("build", model.model_rebuild))

    async def count_turns() -> None:
        nonlocal turn
        while True:
            turn += 1
            await asyncio.sleep(0)

    collector.pause_for_start_up()
    counter = asyncio.create_task(count_turns())
    try:
        await collector.settle_after_ready(modules=(TEST_MODELS,))
    finally:
        counter.cancel()
        gc.enable()
    assert [name for name, _turn in steps] == [
        "shed_start_up_caches", "collect_start_up_garbage", "build", "build", "build",
        "freeze_start_up_objects",
    ]
    turns = [at for _name, at in steps]
    assert turns == sorted(set(turns))  # each in a turn of its own


@pytest.mark.usefixtures("fresh_process")
async def test_a_model_that_cannot_be_built_is_counted_and_the_rest_still_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a module of their own: a model that is never built stays among TEST_MODELS' deferred ones
    # for the rest of the worker (frozen, never collected), and sorted first it took the first
    # build's turn in the tests after it (one failed in a stressed whole run)
    broken = _deferred_model("Broken", "NoSuchType", BROKEN_MODELS)  # nothing defines the type
    fine = _deferred_model("Fine", "str", BROKEN_MODELS)
    settling = await collector.settle_after_ready(modules=(BROKEN_MODELS,))
    assert settling.errors == 1
    assert fine.__pydantic_complete__
    assert not broken.__pydantic_complete__
    assert "model Broken could not be built" in caplog.text
    assert settling.done.is_set()


def test_importing_the_service_models_builds_none_of_them() -> None:
    """READY=1 does not wait for the models: a fresh process imports them unbuilt."""
    code = (
        "from kiosk_agent.service.models import ChargeResult, Interaction, Terminal\n"
        "from kiosk_agent.health.model import HealthSnapshot\n"
        "print([m.__pydantic_complete__ for m in (ChargeResult, Interaction, Terminal,"
        " HealthSnapshot)])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[False, False, False, False]"


@pytest.mark.usefixtures("fresh_process")
async def test_start_up_runs_with_the_collector_paused_until_settling_collects_and_resumes_it(
) -> None:
    """`kiosk-agent run` pauses the collector: what start-up makes lives for the whole run, so
    young-generation passes over it are wasted. Settling collects once, freezes and resumes."""
    collector.pause_for_start_up()
    try:
        assert not gc.isenabled()
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        [Node() for _ in range(5000)]  # well past a young generation's threshold
        assert gone() is not None  # no pass came
        settling = await collector.settle_after_ready(modules=(TEST_MODELS,))
        assert settling.done.is_set()
        assert gc.isenabled()
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.usefixtures("fresh_process")
async def test_a_settling_cut_short_still_resumes_the_collector() -> None:
    """An agent stopped right after READY=1: the collector runs again all the same."""
    model = _deferred_model("CutShort", "int")  # held: settling collects before it builds
    assert not model.__pydantic_complete__
    collector.pause_for_start_up()
    try:
        settling = asyncio.create_task(collector.settle_after_ready(modules=(TEST_MODELS,)))
        await asyncio.sleep(0)  # it has begun building
        settling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settling
        assert gc.isenabled()
    finally:
        gc.enable()


def test_start_up_caches_are_let_go_before_the_freeze() -> None:
    import abc
    import linecache
    import re
    import typing
    from collections.abc import Sized

    class Made:  # a class start-up asked an ABC about
        pass

    pattern = "start-up-only [0-9]+"
    compiled = re.compile(pattern)
    assert re.compile(pattern) is compiled  # re's cache holds it
    alias = typing.Literal["made at start-up"]
    assert typing.Literal["made at start-up"] is alias  # typing's cache holds it
    assert not isinstance(Made(), Sized)
    linecache.cache["<generated at import>"] = (1, None, ["x = 1\n"], "<generated at import>")

    collector.shed_start_up_caches()

    assert re.compile(pattern) is not compiled
    assert typing.Literal["made at start-up"] is not alias
    assert "<generated at import>" not in linecache.cache
    _registry, _cache, negative, _version = abc._get_dump(Sized)  # type: ignore[attr-defined]
    assert not negative  # Made is no longer remembered as not Sized
    assert not isinstance(Made(), Sized)  # and is still answered right


@pytest.fixture
def thresholds_kept() -> Iterator[tuple[int, int, int]]:
    """The collector's thresholds and state as the test found them, put back after it."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)
    gc.enable()


def test_the_loads_garbage_is_collected_as_it_loads_then_the_collector_is_paused(
    thresholds_kept: tuple[int, int, int],
) -> None:
    """The libraries the configuration's load imports make garbage (classes made twice, the
    load's own schemas): collected while it loads, young passes only, so the agent's imports
    after it fill that room; then paused until settling, as before."""
    gc.disable()
    with collector.collecting_while_loading():
        assert gc.isenabled()
        assert gc.get_threshold() == (
            collector.LOAD_YOUNG_THRESHOLD, collector.LOAD_YOUNG_PASSES,
            collector.LOAD_YOUNG_PASSES,
        )
        early = Node()
        early_gone = weakref.ref(early)
        del early
        kept = [Node() for _ in range(2 * collector.LOAD_YOUNG_THRESHOLD)]  # the imports
        assert early_gone() is None  # a pass came while it still loaded
        last = Node()  # dropped as the load ends (its schemas)
        last_gone = weakref.ref(last)
        del last
        linecache.cache["<attrs generated __init__>"] = (1, None, ["x = 1\n"], "<generated>")
    assert last_gone() is None
    assert "<attrs generated __init__>" not in linecache.cache  # its room for the imports
    assert not gc.isenabled()  # start-up's pause
    assert gc.get_threshold() == thresholds_kept
    assert len(kept) == 2 * collector.LOAD_YOUNG_THRESHOLD


def test_a_load_that_fails_still_leaves_the_collector_as_it_was_paused(
    thresholds_kept: tuple[int, int, int],
) -> None:
    with (
        pytest.raises(ValueError, match="broken configuration"),
        collector.collecting_while_loading(),
    ):
        raise ValueError("broken configuration")
    assert not gc.isenabled()  # the run's own `finally` resumes it (cli/agent.py)
    assert gc.get_threshold() == thresholds_kept


async def test_a_run_whose_configuration_is_broken_leaves_the_collector_running(
    tmp_path: Any, thresholds_kept: tuple[int, int, int],
) -> None:
    """`kiosk-agent run` with a configuration it refuses: the exit with its mistakes, and the
    collector as it was (running, at its usual thresholds), not left paused for a process that
    goes on (the tests, an embedding)."""
    import argparse

    from kiosk_agent.cli.agent import run_command
    from kiosk_agent.cli.contract import CliError

    broken = tmp_path / "kiosk.yaml"
    broken.write_text("service: {base_url: 7}\n")
    with pytest.raises(CliError, match="mistake"):
        await run_command(argparse.Namespace(config=str(broken)))
    assert gc.isenabled()
    assert gc.get_threshold() == thresholds_kept
