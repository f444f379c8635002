"""What every simulator module is given: the options and the shared state of one simulator."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kiosk_agent.sim.auth import Auth
from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.ledger import Ledger
from kiosk_agent.sim.ratelimit import RateLimiter
from kiosk_agent.sim.store import Store

if TYPE_CHECKING:
    from kiosk_agent.sim.hpp import HostedPages
    from kiosk_agent.sim.payments import Payments
    from kiosk_agent.sim.plans import BillingPlans
    from kiosk_agent.sim.terminal import Terminals
    from kiosk_agent.sim.vault import Vault


@dataclass(slots=True)
class SimOptions:
    """The simulator's knobs; the command line ``kiosk-agent sim`` maps onto these one to one."""

    host: str = "127.0.0.1"
    port: int = 0
    time_scale: float = 1.0
    seed: int = 1
    transactions: int = 1000  # size of the seeded reporting data set
    webhook_url: str | None = None
    webhook_secret: str | None = None
    rate_limit: str | None = None  # "R/S": R requests per S seconds; default 20/s, burst 40
    data_dir: Path | None = None  # None: state in memory only
    chaos: bool = False  # webhooks: duplicate and reorder deliveries
    verbose: bool = False  # each request on one line (logger kiosk_agent.sim.access)


@dataclass(slots=True)
class PushStats:
    """Delays from an interaction change to its WebSocket frame being written (real seconds)."""

    delays: list[float] = field(default_factory=list)
    limit: int = 100_000

    def record(self, seconds: float) -> None:
        if len(self.delays) < self.limit:
            self.delays.append(seconds)


@dataclass(slots=True)
class SimContext:
    options: SimOptions
    clock: VirtualClock
    store: Store
    ledger: Ledger
    auth: Auth
    rate_limiter: RateLimiter
    # Seeded: the same seed gives the same card tokens, auth codes and data set.
    rng: random.Random
    push_stats: PushStats = field(default_factory=PushStats)
    # Modules keep their own service objects here by name (e.g. "webhooks").
    extras: dict[str, Any] = field(default_factory=dict)
    # Set by each module's setup(); other modules use them (the terminal charges through
    # payments, payments vaults through the vault).
    payments: Payments = field(init=False)
    vault: Vault = field(init=False)
    plans: BillingPlans = field(init=False)
    hosted_pages: HostedPages = field(init=False)
    terminals: Terminals = field(init=False)


CONTEXT_KEY = web.AppKey("sim_context", SimContext)


def sim_context(request: web.Request) -> SimContext:
    """The simulator a request arrived at."""
    return request.app[CONTEXT_KEY]
