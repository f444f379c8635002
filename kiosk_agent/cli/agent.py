"""`kiosk-agent run`: the agent itself (`check-config` is cli/check_config.py's, `sales` is
cli/sales.py's)."""

from __future__ import annotations

import argparse
import contextlib
from typing import TYPE_CHECKING

from kiosk_agent.cli.contract import (
    EXIT_JOURNAL_OWNED,
    CliError,
    StopSignals,
    config_path,
    guarded,
    load,
    options,
)

# The configuration loader and the journal are imported by the commands that use them: the
# parser (`--help`, shell completion) must not wait for YAML, voluptuous and sqlite.
if TYPE_CHECKING:
    from kiosk_agent.assembly.agent import Agent
    from kiosk_agent.config.load import Config
    from kiosk_agent.sales.owner import JournalLock


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = subparsers.add_parser("run", help="run the agent", parents=options(json=False))
    run.set_defaults(handler=guarded(run_command))


# -- run ---------------------------------------------------------------------------------------


async def run_command(args: argparse.Namespace) -> int:
    """Run until a stop signal (:data:`STOP_SIGNALS`), then stop gracefully: new sales refused,
    the running ones heard to their end within ``sales.stop_timeout`` (a second signal ends
    that wait) and what is still open parked; the exit code says which signal it was."""
    import gc

    try:
        return await _run(args)
    finally:
        gc.enable()  # a run that ended before settling


async def _run(args: argparse.Namespace) -> int:
    from kiosk_agent.assembly.collector import collecting_while_loading

    # the libraries' import garbage collected as they load, then no collection until the agent
    # settles after READY=1 (assembly/collector.py)
    with collecting_while_loading():
        config = load(config_path(args))
    from kiosk_agent.sales.journal import JournalError
    from kiosk_agent.sales.owner import JournalLock, JournalOwned

    owner = JournalLock(config.resolve(config["journal"]["path"]))
    try:
        owner.acquire()
    except JournalOwned as err:
        # a distinct code: restarting cannot help while the other agent lives (the unit's
        # RestartPreventExitStatus), and a copied unit file must not loop on it
        raise CliError(str(err), EXIT_JOURNAL_OWNED) from None
    except JournalError as err:
        raise CliError(str(err)) from None
    try:
        return await _run_owning(args, config, owner)
    finally:
        from kiosk_agent.sales.journal_inspect import taken_ahead

        untaken = taken_ahead(owner.journal)  # a run stopped before its agent opened the journal
        if untaken is not None:
            untaken.exception()  # waited for: the file is let go once nothing looks at it
        owner.release()


async def _run_owning(args: argparse.Namespace, config: Config, owner: JournalLock) -> int:
    """The run once the journal is this process's: its file is looked at in a thread of its
    own while the agent is imported (a year of sales: 0.3 s of a second core, not of the path
    to READY=1; sales/journal_inspect.py)."""
    from kiosk_agent.sales.journal_inspect import inspect_ahead

    inspect_ahead(owner.journal)
    from kiosk_agent.app import agent_for
    from kiosk_agent.cli.embedded import embedded_simulator, simulated_machines
    from kiosk_agent.logs import setup_logging
    from kiosk_agent.sales.journal import JournalError
    from kiosk_agent.sales.owner import JournalOwned

    setup_logging(config["logging"])
    # Before anything starts: a signal during the start is a graceful stop once it is done.
    signals = StopSignals(
        "stopping: new sales refused, the sales running finish within sales.stop_timeout "
        f"({config['sales']['stop_timeout']:g} s) or are parked; a second signal ends the wait"
    ).install()
    if signals.received is not None:  # it came while the run was still reading its config
        signals.remove()
        return signals.exit_code
    try:
        async with agent_for(
            config, simulator=embedded_simulator, machines=simulated_machines, owner=owner
        ) as (agent, _service):
            await _start_unless_stopped(agent, signals)
            await signals.wait()
            if agent.started:  # the drain, cut short by a second signal
                await agent.stop(interrupt=signals.again)
    except JournalOwned as err:
        # a distinct code: restarting cannot help while the other agent lives (the unit's
        # RestartPreventExitStatus), and a copied unit file must not loop on it
        raise CliError(str(err), EXIT_JOURNAL_OWNED) from None
    except JournalError as err:
        # a read-only disk, a bad path: say so, no traceback
        raise CliError(str(err)) from None
    finally:
        # stopped: a late signal cannot strand anything now, nor kill the exiting process
        signals.remove(then_ignore=getattr(args, "owns_process", False))
    return signals.exit_code


async def _start_unless_stopped(agent: Agent, signals: StopSignals) -> None:
    """The agent's start, ended by a stop signal while it still waits (for its journal's disk:
    sales/journal_guard.py); what had started is stopped again (Agent.start)."""
    import asyncio

    starting = asyncio.ensure_future(agent.start())
    stopping = asyncio.ensure_future(signals.event.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    starting.result()
