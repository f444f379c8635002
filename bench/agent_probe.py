"""`kiosk-agent` run with a profiler and a memory snapshot a bench can take from outside.

    python bench/agent_probe.py DIR run --config FILE
    BENCH_EVENT_LOOP=uvloop python bench/agent_probe.py - run --config FILE

The benches (``bench/pi.py --profile``, ``bench/agent.py --tracemalloc``) spawn the agent through
this launcher instead of ``python -m kiosk_agent``. A thread looks for a request file in DIR every
50 ms and hands it to the agent's event loop, so what is measured runs on the loop's own thread
(cProfile follows one thread) between two loop turns, never in the middle of a sale:

- ``profile.start``: cProfile on, timing the thread's CPU (an fsync or a throttled wait does not
  count); ``profile.stop``: off, its statistics to ``DIR/profile.pstats``;
- ``snapshot``: a tracemalloc snapshot to ``DIR/tracemalloc.snapshot`` (tracing runs from the
  start, so the agent's own imports are in it: started with ``PYTHONTRACEMALLOC=1``);
- ``modules``: the names in ``sys.modules``, in the order they were imported, to
  ``DIR/modules.txt`` (``bench/agent.py --modules``).

Each request file is removed once done, and ``DIR/<request>.done`` written: the bench waits for it.
DIR ``-``: no requests (no thread). With ``BENCH_EVENT_LOOP=uvloop`` the agent runs on uvloop's
loop instead of asyncio's (``bench/agent.py --event-loop uvloop``: issue 33 asks for its figures).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import runpy
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

LAUNCHER = str(Path(__file__).resolve())
loops: list[asyncio.AbstractEventLoop] = []


class RecordingPolicy(asyncio.DefaultEventLoopPolicy):
    """The default policy, keeping the loop that `asyncio.run` makes."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        if os.environ.get("BENCH_EVENT_LOOP") == "uvloop":
            import uvloop  # type: ignore[import-not-found,unused-ignore]  # not a dependency

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        else:
            loop = super().new_event_loop()
        loops.append(loop)
        return loop


def serve(directory: Path) -> None:
    profiler = cProfile.Profile(time.thread_time)  # CPU of the loop's thread, not waits

    def stop_profile() -> None:
        profiler.disable()
        profiler.dump_stats(directory / "profile.pstats")

    def snapshot() -> None:
        tracemalloc.take_snapshot().dump(str(directory / "tracemalloc.snapshot"))

    def modules() -> None:  # in the order they were imported
        (directory / "modules.txt").write_text("\n".join(list(sys.modules)))

    actions: dict[str, Callable[[], None]] = {
        "profile.start": profiler.enable, "profile.stop": stop_profile, "snapshot": snapshot,
        "modules": modules,
    }
    while True:
        time.sleep(0.05)
        for name, action in actions.items():
            request = directory / name
            if request.exists() and loops:
                request.unlink()
                loops[-1].call_soon_threadsafe(_then_mark, action, directory / f"{name}.done")


def _then_mark(action: Callable[[], None], done: Path) -> None:
    action()
    done.write_text("done")


def main() -> None:
    directory = Path(sys.argv[1])
    sys.argv = ["kiosk-agent", *sys.argv[2:]]  # not "-": the agent's own argv from here
    asyncio.set_event_loop_policy(RecordingPolicy())
    if str(directory) != "-":
        threading.Thread(target=serve, args=(directory,), daemon=True).start()
    runpy.run_module("kiosk_agent", run_name="__main__", alter_sys=True)


async def request(directory: Path, name: str, within_s: float = 30.0) -> None:
    """Ask the probed agent for ``name`` and wait until it is done (for the benches)."""
    done = directory / f"{name}.done"
    done.unlink(missing_ok=True)
    (directory / name).write_text("")
    deadline = time.monotonic() + within_s
    while not done.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the probed agent did not do {name} within {within_s} s")
        await asyncio.sleep(0.02)


if __name__ == "__main__":
    main()
