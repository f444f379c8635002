"""One Debian chromium per pytest worker, reached over the DevTools protocol (CDP).

Launching chromium costs seconds of CPU (7-10 s a test on a loaded 2-core machine); a test only
needs a fresh browser context, which connecting over CDP gives it for a fraction of that.

The browser is Debian's chromium-headless-shell, the headless build Playwright's own launch()
uses: the same Blink and V8 as the full chromium's --headless, without the desktop browser
around them. The full browser spent about three times its CPU on the same pages (five of the
status page's tests: 9.1 s of chromium CPU against 2.8 s; 2.3-5 s a test against 0.4-1)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from playwright.async_api import Browser, Playwright
from playwright.async_api import Error as PlaywrightError

CHROMIUM = "/usr/bin/chromium-headless-shell"  # Debian's, by ./dev test; never a downloaded build
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# What Playwright's launch() added to CHROMIUM_ARGS, which the tests were written against: no
# first window (a fresh connection has no startup tab to attach to), no throttled timers or
# renderers for a page that is not in front, /tmp rather than a container's small /dev/shm.
LAUNCH_LIKE_ARGS = [
    "--no-startup-window",
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-renderer-backgrounding",
    "--disable-dev-shm-usage",
    "--disable-hang-monitor",
]
DEVTOOLS_LINE = "DevTools listening on "
START_TIMEOUT_S = 60.0  # a cold start on a loaded machine takes a few seconds
STOP_TIMEOUT_S = 10.0
# attaching to a running chromium takes well under a second; one that hangs there (seen once:
# the attach timed out, cause unknown) is stopped and a new one started
ATTACH_TIMEOUT_S = 20.0


class ChromiumStartError(RuntimeError):
    pass


PROFILE_QUIET_S = 0.2  # a removed profile that stays gone this long is gone for good


class SharedChromium:
    """A chromium started on first use, started again when it has died, stopped by ``stop``."""

    def __init__(self, executable: str = CHROMIUM) -> None:
        self.executable = executable
        self.process: subprocess.Popen[str] | None = None
        self.starts = 0
        self.attach_failures = 0  # attaches that failed and had chromium started anew
        self._endpoint = ""
        self._profile = ""

    def endpoint(self) -> str:
        """The ws:// address of a running chromium: this one, or a new one if it died."""
        if self.process is None or self.process.poll() is not None:
            self.stop()
            self._start()
        return self._endpoint

    def _start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="kiosk-agent-chromium-")
        # its own session: stop() kills what a chromium that crashed left behind in its group
        process = subprocess.Popen(
            [
                self.executable,
                *CHROMIUM_ARGS,
                *LAUNCH_LIKE_ARGS,
                "--remote-debugging-port=0",
                f"--user-data-dir={self._profile}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.process = process
        assert process.stderr is not None
        found: queue.Queue[str | None] = queue.Queue()
        threading.Thread(
            target=_read_stderr, args=(process.stderr, found), name="chromium-stderr", daemon=True
        ).start()
        try:
            line = found.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            line = None
        if line is None:
            self.stop()
            raise ChromiumStartError(
                f"{self.executable} printed no '{DEVTOOLS_LINE}ws://...' line on stderr within "
                f"{START_TIMEOUT_S:.0f} s (exit code {process.returncode})"
            )
        self._endpoint = line.split(DEVTOOLS_LINE, 1)[1].strip()
        self.starts += 1

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()  # chromium ends and reaps its renderers and zygote itself
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        if process is not None:
            _signal_group(process, signal.SIGKILL)  # children left behind by a chromium that died
            # a SIGKILL is delivered, not done: on a busy machine a renderer still ran when
            # stop() returned. Not our children (chromium's), so no wait(): looked for instead
            _wait_until_gone(process.pid, STOP_TIMEOUT_S)
        if self._profile:
            _remove_profile(Path(self._profile))
            self._profile = ""


def _remove_profile(profile: Path) -> None:
    """``profile`` removed, and removed again if it comes back within a moment: a whole run
    found it made anew after stop() (``Default/declarative_performance_observer.db-journal``
    alone in it, at the time of the kill), written by a chromium process that was still
    finishing when its group was seen gone. Bounded: STOP_TIMEOUT_S at most."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    gone_since: float | None = None
    while time.monotonic() < deadline:
        if profile.exists():
            shutil.rmtree(profile, ignore_errors=True)
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= PROFILE_QUIET_S:
            return
        time.sleep(0.02)


async def connect(
    playwright: Playwright, chromium: SharedChromium, timeout_s: float = ATTACH_TIMEOUT_S
) -> Browser:
    """The worker's chromium over CDP. An attach that fails or hangs is tried once more on a
    chromium started anew (the old one stopped): a test fails only when a fresh one fails too."""
    for attempt in (1, 2):
        # a (re)start blocks for a second or two: off the loop, where the agent already runs
        endpoint = await asyncio.to_thread(chromium.endpoint)
        try:
            return await playwright.chromium.connect_over_cdp(
                endpoint, timeout=timeout_s * 1000
            )
        except PlaywrightError:
            if attempt == 2:
                raise
            chromium.attach_failures += 1
            await asyncio.to_thread(chromium.stop)
    raise AssertionError("unreachable")


def _read_stderr(stderr: IO[str], found: queue.Queue[str | None]) -> None:
    """Hands over the DevTools line, then keeps draining stderr so chromium never blocks on it."""
    announced = False
    for line in stderr:
        if not announced and DEVTOOLS_LINE in line:
            found.put(line)
            announced = True
    if not announced:
        found.put(None)  # chromium exited (or closed stderr) without listening


def _signal_group(process: subprocess.Popen[str], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _wait_until_gone(group: int, timeout_s: float) -> None:
    """Until no process of ``group`` runs any more (zombies wait for init: they do not)."""
    give_up_at = time.monotonic() + timeout_s
    while running_in_group(group) and time.monotonic() < give_up_at:
        time.sleep(0.01)


def running_in_group(group: int) -> list[int]:
    """Processes of a process group that still run (zombies, waiting for init, do not)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        state, process_group = fields[0], int(fields[2])
        if process_group == group and state != "Z":
            running.append(int(stat.parent.name))
    return running
