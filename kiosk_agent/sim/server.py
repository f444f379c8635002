"""The simulator as one aiohttp server: base, reporting and WebSocket addresses on one port.

```python
sim = SimServer(SimOptions(port=0, time_scale=50, seed=1, transactions=200))
await sim.start()
sim.base_url, sim.reporting_url, sim.ws_url, sim.ready_info()
await sim.stop()
```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from kiosk_agent.sim import auth as sim_auth
from kiosk_agent.sim import (
    boarding,
    cable,
    faults,
    hpp,
    oauth,
    payments,
    plans,
    reporting,
    terminal,
    vault,
)
from kiosk_agent.sim.auth import Auth
from kiosk_agent.sim.clock import VirtualClock
from kiosk_agent.sim.context import CONTEXT_KEY, SimContext, SimOptions
from kiosk_agent.sim.http import bad_request, error_middleware, json_response, read_json
from kiosk_agent.sim.ledger import Ledger, deposit_resource
from kiosk_agent.sim.ratelimit import DEFAULT_RATE_LIMIT, RateLimit, RateLimiter
from kiosk_agent.sim.store import Store
from kiosk_agent.tasks import cancel_and_wait

__all__ = ["SimContext", "SimOptions", "SimServer"]

_LOGGER = logging.getLogger(__name__)
_ACCESS_LOG = logging.getLogger("kiosk_agent.sim.access")  # `kiosk-agent sim -v`

# Real seconds between saves of the virtual clock, so a restart never runs time backwards.
_CLOCK_CHECKPOINT_S = 1.0
# The largest request body the server reads at all; JSON handlers refuse far smaller ones.
_CLIENT_MAX_SIZE = 1024 * 1024


class SimServer:
    def __init__(self, options: SimOptions | None = None) -> None:
        self.options = options or SimOptions()
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._checkpoint: asyncio.Task[None] | None = None
        self.ctx: SimContext | None = None
        self.app: web.Application | None = None

    # -- addresses -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self._url_host}:{self._port}"

    @property
    def reporting_url(self) -> str:
        return self.base_url

    @property
    def ws_url(self) -> str:
        return f"ws://{self._url_host}:{self._port}"

    @property
    def _url_host(self) -> str:
        host = self.options.host
        if host in ("0.0.0.0", ""):  # noqa: S104 - naming the wildcard, not binding it
            return "127.0.0.1"
        return f"[{host}]" if ":" in host else host

    def ready_info(self) -> dict[str, Any]:
        """The ``READY`` json: addresses, the seeded credentials and the time scale.

        ``time_scale`` and ``interaction_lifetime_s`` (the 3-minute lifetime divided by it, in
        real seconds) tell a client how long interactions live here
        (``sales.interaction_lifetime``).

        ``refresh_token`` is the one that rotates ``api_key`` now: ``null`` once a simulator
        restarted on its data directory has already spent ``sim_refresh_token``.
        """
        refresh_token: str | None = sim_auth.REFRESH_TOKEN
        if self.ctx is not None and self._runner is not None:
            refresh_token = self.ctx.auth.refresh_token_for(sim_auth.API_KEY)
        return {
            "base_url": self.base_url,
            "reporting_url": self.reporting_url,
            "ws_url": self.ws_url,
            "api_key": sim_auth.API_KEY,
            "refresh_token": refresh_token,
            "isv_api_key": sim_auth.ISV_API_KEY,
            "mid": sim_auth.MID,
            "isv_mids": list(sim_auth.ISV_MIDS),
            "client_id": oauth.CLIENT_ID,
            "client_secret": oauth.CLIENT_SECRET,
            "time_scale": self.options.time_scale,
            "interaction_lifetime_s": terminal.INTERACTION_LIFETIME_S / self.options.time_scale,
        }

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("simulator already started")
        self.ctx = ctx = build_context(self.options)
        runner: web.AppRunner | None = None
        try:
            self.app = build_app(ctx)
            runner = web.AppRunner(
                self.app, handle_signals=False, access_log_format='%r %s %Tfs',
                access_log=_ACCESS_LOG if self.options.verbose else None,
            )
            await runner.setup()
            await web.TCPSite(runner, self.options.host, self.options.port).start()
        except BaseException:
            if runner is not None:
                await runner.cleanup()
            ctx.store.close()
            raise
        self._runner = runner
        self._port = _bound_port(runner)
        if ctx.store.persistent:
            self._checkpoint = asyncio.create_task(_checkpoint_clock(ctx))
        _LOGGER.info("Simulator listening on %s", self.base_url)

    async def stop(self) -> None:
        if self._runner is None:
            return
        await cancel_and_wait(self._checkpoint)
        self._checkpoint = None
        await self._runner.cleanup()
        self._runner = None
        if self.ctx is not None:
            _save_clock(self.ctx)
            self.ctx.store.close()

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def build_context(options: SimOptions) -> SimContext:
    store = Store(options.data_dir)
    # A restarted simulator continues from where its virtual clock stood, never earlier.
    start = max(time.time(), float(store.get_meta("clock", 0.0)))
    clock = VirtualClock(options.time_scale, start=start)
    limit = RateLimit.parse(options.rate_limit) if options.rate_limit else DEFAULT_RATE_LIMIT
    return SimContext(
        options=options,
        clock=clock,
        store=store,
        ledger=Ledger(store, clock),
        auth=Auth(store, clock),
        rate_limiter=RateLimiter(limit),
        rng=random.Random(options.seed),
    )


def build_app(ctx: SimContext) -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=_CLIENT_MAX_SIZE)
    app[CONTEXT_KEY] = ctx
    for setup in _MODULE_SETUPS:
        setup(app, ctx)
    app.router.add_post("/sim/settle", _settle)
    app.router.add_get("/sim/stats", _stats)
    app.router.add_post("/sim/rate-limit", _set_rate_limit)
    return app


# Every module's setup(app, ctx), in order: later modules use what earlier ones put in ctx.
_MODULE_SETUPS: tuple[Callable[[web.Application, SimContext], None], ...] = (
    payments.setup,
    vault.setup,
    plans.setup,
    hpp.setup,
    terminal.setup,
    cable.setup,
    oauth.setup,
    reporting.setup,
    boarding.setup,
    faults.setup,
)


async def _settle(request: web.Request) -> web.Response:
    """Test helper: settle the open batch now (no auth, like a sandbox's test helpers)."""
    ctx = request.app[CONTEXT_KEY]
    settled, deposits = ctx.ledger.settle_open_batch()
    return json_response(
        {"settled": settled, "deposits": [deposit_resource(row) for row in deposits]}
    )


async def _set_rate_limit(request: web.Request) -> web.Response:
    """Test helper ``POST /sim/rate-limit {"requests": R, "per_s": S}`` (no auth)."""
    body = await read_json(request)
    values = []
    for name in ("requests", "per_s"):
        value = body.data.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise bad_request(f"field {name!r} must be a number above 0, got {value!r}")
        values.append(float(value))
    limit = RateLimit.of(*values)
    request.app[CONTEXT_KEY].rate_limiter.change(limit)
    return json_response({"requests": limit.requests, "per_s": limit.seconds, "burst": limit.burst})


async def _stats(request: web.Request) -> web.Response:
    """Test helper: WebSocket push delays (real ms), ledger and request counts, for benchmarks."""
    ctx = request.app[CONTEXT_KEY]
    delays = sorted(ctx.push_stats.delays)
    return json_response(
        {
            "pushes": len(delays),
            "push_p50_ms": _percentile_ms(delays, 0.50),
            "push_p99_ms": _percentile_ms(delays, 0.99),
            "transactions": ctx.ledger.count(),
            "requests": _requests(ctx),
        }
    )


def _requests(ctx: SimContext) -> int | None:
    """Requests served outside ``/sim/`` (counted by the fault middleware, which sees them all)."""
    found = faults.faults_of(ctx)
    return found.requests if found is not None else None


def _percentile_ms(ordered: list[float], share: float) -> float | None:
    if not ordered:
        return None
    index = min(len(ordered) - 1, round(share * (len(ordered) - 1)))
    return round(ordered[index] * 1000, 3)


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("simulator has no bound TCP address")


async def _checkpoint_clock(ctx: SimContext) -> None:
    while True:
        await asyncio.sleep(_CLOCK_CHECKPOINT_S)
        _save_clock(ctx)


def _save_clock(ctx: SimContext) -> None:
    with contextlib.suppress(Exception):
        ctx.store.set_meta("clock", ctx.clock.time())
