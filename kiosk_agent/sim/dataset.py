"""The seeded reporting data set: months of plausible kiosk sales, the same for the same seed.

:func:`generate` is a pure, streaming generator: given a seed, a number of transaction rows and
the instant the data set ends, it yields the same records every time, in chronological order,
holding only a handful in memory (pending refunds, the day's deposit totals). :func:`seed_into`
feeds them to the ledger's bulk insert in chunks, so 100,000 rows go to SQLite in seconds.

What it makes, consistently:
- sales on both MIDs and all four card brands, masked card numbers, AVS/CVV answers;
- statuses per choices.md: settled sales in daily batches per merchant (``batch_id``,
  ``funding_master_id``, ``settlement_date`` at 01:00 the next day), declines, retries, voids,
  and in the last day an open batch of captured and authorized sales that ``/sim/settle`` takes;
- refunds as their own rows (status 5) naming the sale in ``related_trans_id``, the sale then
  partially refunded (8) or refunded (9); a refund settles in the batch of its own day;
- one deposit per batch whose amount is the batch's sales less its refunds;
- chargebacks on about one settled sale in a hundred, each with a chargeback fee adjustment,
  and a monthly account fee per merchant.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from kiosk_agent.service.models.reporting import TransStatus as S
from kiosk_agent.sim.auth import ISV_MIDS
from kiosk_agent.sim.clock import iso_ms
from kiosk_agent.sim.ledger import (
    BATCH_IDS,
    CUSTOM_FIELDS,
    DECIMAL_FIELDS,
    DEPOSIT_IDS,
    FUNDING_IDS,
    INT_FIELDS,
    TEXT_FIELDS,
    TRANS_IDS,
)
from kiosk_agent.sim.store import Store

if TYPE_CHECKING:
    from kiosk_agent.sim.context import SimContext
    from kiosk_agent.sim.ledger import Ledger
    from kiosk_agent.sim.reporting import ReportTables

DAY = 86400.0
WINDOW_DAYS = 90
CHUNK_ROWS = 20_000  # rows per executemany: large, yet a bounded buffer
MIDS = ISV_MIDS  # the merchant key's MID and the second MID of the ISV key
META_KEY = "dataset"

CHARGEBACK_ID_START = 8000001
ADJUSTMENT_ID_START = 9000001

CHARGEBACK_EVERY = 97  # one settled sale in this many is disputed
REFUND_SHARE = 0.04
CHARGEBACK_FEE_CENTS = -1500
MONTHLY_FEE_CENTS = -995

# card_brand_id -> (issuer prefixes, card number length, interchange rate % of the brand)
BRANDS: dict[int, tuple[tuple[str, ...], int, str]] = {
    1: (("411111", "424242", "476173"), 16, "1.80"),
    2: (("510510", "545454", "222300"), 16, "1.65"),
    3: (("371449", "378282"), 15, "2.30"),
    4: (("601111", "644564"), 16, "1.55"),
}
BRAND_WEIGHTS = (50, 30, 12, 8)
# One entry per percent of sales: picking from it is one random number.
_BRAND_TABLE = tuple(b for b, w in zip(BRANDS, BRAND_WEIGHTS, strict=True) for _ in range(w))
REASONS: dict[int, tuple[tuple[str, str], ...]] = {
    1: (("10.4", "Other Fraud - Card Absent Environment"), ("13.1", "Merchandise Not Received")),
    2: (("4837", "No Cardholder Authorization"), ("4853", "Cardholder Dispute")),
    3: (("F29", "Card Not Present"), ("C08", "Goods Not Received")),
    4: (("UA02", "Fraud - Card Not Present"), ("AA", "Does Not Recognize")),
}
FIRST_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Eva", "Femi", "Grace", "Hugo", "Iris", "Jon", "Kai")
LAST_NAMES = ("Okafor", "Smith", "Nguyen", "Garcia", "Muller", "Rossi", "Tanaka", "Silva", "Cohen")
PRODUCTS = ("A1 Cola", "A2 Water", "B1 Chips", "B4 Candy", "C2 Coffee", "D1 Sandwich", "E3 Charger")

Kind = Literal["transaction", "deposit", "chargeback", "adjustment"]
Record = tuple[Kind, dict[str, Any]]

# The columns the data set fills. Every row has all of them, so the ledger's bulk insert is one
# statement; the rest (custom_02..custom_10, currency) keep their defaults and cost no binding.
_SEEDED_COLUMNS = (
    *(name for name in TEXT_FIELDS if name not in CUSTOM_FIELDS[1:]), *INT_FIELDS,
    *DECIMAL_FIELDS, "amount_cents", "authorized_cents", "refunded_cents",
)  # fmt: skip
_ROW_TEMPLATE: dict[str, Any] = {
    **dict.fromkeys(_SEEDED_COLUMNS),
    "user_identifier": "portal",
    "refunded_cents": 0,
    "interchange_per_item": "0.10",
}


@dataclass(frozen=True, slots=True)
class IdBases:
    """First ids of the blocks reserved for one data set."""

    trans_id: int = TRANS_IDS.start
    batch_id: int = BATCH_IDS.start
    funding: int = FUNDING_IDS.start
    deposit_id: int = DEPOSIT_IDS.start


def generate(seed: int, count: int, end: float, ids: IdBases | None = None) -> Iterator[Record]:
    """Yield ``count`` transaction rows and their deposits, chargebacks and adjustments.

    ``end`` is the Unix time the data set stops at; it covers the ninety days before it and the
    last of those days is the open (unsettled) batch.
    """
    yield from _Generator(seed, count, end, ids or IdBases()).run()


class _Generator:
    def __init__(self, seed: int, count: int, end: float, ids: IdBases) -> None:
        self.rng = random.Random(f"dataset:{seed}")
        self.count = count
        self.end = end
        self.start = end - WINDOW_DAYS * DAY
        self.open_from = end - DAY  # rows from here on are in the open batch
        self.ids = ids
        self.spacing = (end - self.start) / max(count, 1)
        self.produced = 0
        self.settled_sales = 0
        self.chargebacks = 0
        self.adjustments = 0
        self.day_prefix: dict[int, str] = {}
        self.settle_dates: dict[int, str] = {}
        self.tickets = 0  # orders pending refunds that fall due at the same instant
        # (due time, tie-breaker, refund row) of refunds not yet reached in time
        self.pending: list[tuple[float, int, dict[str, Any]]] = []
        # (mid index, day) -> [net cents, rows] of settled batches not yet closed
        self.batches: dict[tuple[int, int], list[int]] = {}
        self.closed_day = -1

    def run(self) -> Iterator[Record]:
        yield from self._monthly_fees()
        while self.produced + len(self.pending) < self.count:
            moment = self.start + (self.produced + self.rng.random()) * self.spacing
            yield from self._due_refunds(moment)
            yield from self._close_days_before(self._day(moment))
            yield from self._sale(moment)
        yield from self._due_refunds(float("inf"))
        yield from self._close_days_before(WINDOW_DAYS)

    # -- sales -----------------------------------------------------------------------------
    def _sale(self, moment: float) -> Iterator[Record]:
        mid_index = 0 if self._unit() < 0.7 else 1
        brand = _BRAND_TABLE[self._below(len(_BRAND_TABLE))]
        amount = self._amount()
        row = self._base_row(moment, mid_index, brand, amount)
        roll = self._unit()
        if roll < 0.05:
            self._answer(row, "C", "05", "Declined", S.DECLINED)
        elif roll < 0.07:
            self._answer(row, "B", "91", "Retry", S.RETRY)
        elif roll < 0.10:
            self._answer(row, "A", "00", "Voided", S.VOIDED)
        elif moment >= self.open_from:
            status = S.AUTHORIZED if roll < 0.30 else S.CAPTURED
            self._answer(row, "A", "00", "Approval", status)
        else:
            self._answer(row, "A", "00", "Approval", S.SETTLED)
            self._settle(row, mid_index, moment, amount)
            yield from self._after_settled(row, mid_index, moment, brand)
        self.produced += 1
        yield "transaction", row

    def _after_settled(
        self, row: dict[str, Any], mid_index: int, moment: float, brand: int
    ) -> Iterator[Record]:
        self.settled_sales += 1
        if self.settled_sales % CHARGEBACK_EVERY == 0:
            yield from self._chargeback(row, mid_index, moment, brand)
        elif self.rng.random() < REFUND_SHARE and self._room_for_refund():
            self._plan_refund(row, moment)

    def _room_for_refund(self) -> bool:
        # The sale being made is not yet counted; its refund must still fit in ``count``.
        return self.produced + len(self.pending) + 2 <= self.count

    def _amount(self) -> int:
        if self._unit() < 0.9:
            return self._below(481) * 5 + 100  # $1.00 .. $25.00 in nickels: a kiosk's prices
        return self._below(12501) + 2500

    # The hot path makes 100,000 rows: these avoid random.randint/choice, several times slower.
    def _below(self, n: int) -> int:
        return int(self.rng.random() * n)

    def _unit(self) -> float:
        return self.rng.random()

    def _base_row(self, moment: float, mid_index: int, brand: int, amount: int) -> dict[str, Any]:
        # The hottest code of a 100,000-row seed: plain assignments and a bound random().
        rnd = self.rng.random
        bits = self.rng.getrandbits
        prefixes, length, rate = BRANDS[brand]
        trans_date = self._iso(moment)
        card_present = rnd() < 0.75
        row = dict(_ROW_TEMPLATE)
        row["trans_id"] = str(self.ids.trans_id + self.produced)
        row["mid"] = MIDS[mid_index]
        row["order_id"] = f"K{bits(48):012X}"
        row["trans_date"] = trans_date
        row["account_token"] = f"tok_{bits(96):024x}"
        row["card_brand_id"] = brand
        prefix = prefixes[int(rnd() * len(prefixes))]
        row["card_number"] = f"{prefix}{'*' * (length - 10)}{int(rnd() * 10000):04d}"
        expiry_year = (int(trans_date[2:4]) + int(rnd() * 4) + 1) % 100
        row["expiration"] = f"{int(rnd() * 12) + 1:02d}{expiry_year:02d}"
        first = FIRST_NAMES[int(rnd() * len(FIRST_NAMES))]
        row["name"] = f"{first} {LAST_NAMES[int(rnd() * len(LAST_NAMES))]}"
        row["avs_resp"] = "YYYZAN"[int(rnd() * 6)]
        row["cvv_resp"] = "MMMMN"[int(rnd() * 5)]
        if card_present:
            row["terminal_id"] = f"SIM-{int(rnd() * 8) + 1:04d}"
            row["user_identifier"] = "kiosk-agent"
        row["custom_01"] = PRODUCTS[int(rnd() * len(PRODUCTS))]
        if rnd() < 0.1:
            row["vault_id"] = int(rnd() * 9000) + 1000
        row["amount_cents"] = row["authorized_cents"] = amount
        row["interchange_rate"] = rate
        return row

    def _iso(self, moment: float) -> str:
        """``iso_ms`` for the hot path: the date part is formatted once per day."""
        day, rest = divmod(int(moment * 1000), 86_400_000)
        prefix = self.day_prefix.get(day)
        if prefix is None:
            prefix = self.day_prefix[day] = iso_ms(day * DAY)[:11]
        seconds, millis = divmod(rest, 1000)
        minutes, second = divmod(seconds, 60)
        hour, minute = divmod(minutes, 60)
        return f"{prefix}{hour:02d}:{minute:02d}:{second:02d}.{millis:03d}Z"

    def _answer(
        self, row: dict[str, Any], result: str, code: str, text: str, status: S
    ) -> None:
        row.update(result=result, resp_code=code, resp_text=text, trans_status_id=int(status))
        if result == "A":
            row["auth_code"] = f"{self.rng.getrandbits(24):06X}"
        else:
            row.update(interchange_rate=None, interchange_per_item=None)

    # -- settlement ------------------------------------------------------------------------
    def _day(self, moment: float) -> int:
        return min(WINDOW_DAYS - 1, int((moment - self.start) // DAY))

    def _batch_ids(self, mid_index: int, day: int) -> tuple[str, str]:
        slot = day * len(MIDS) + mid_index
        return str(self.ids.batch_id + slot), f"FM{self.ids.funding + slot}"

    def _settle(self, row: dict[str, Any], mid_index: int, moment: float, net: int) -> None:
        day = self._day(moment)
        batch_id, funding = self._batch_ids(mid_index, day)
        row.update(
            batch_id=batch_id,
            funded_batch_id=batch_id,
            funding_master_id=funding,
            settlement_date=self._settlement_date(day),
        )
        totals = self.batches.setdefault((mid_index, day), [0, 0])
        totals[0] += net
        totals[1] += 1

    def _settlement_date(self, day: int) -> str:
        found = self.settle_dates.get(day)
        if found is None:
            found = self.settle_dates[day] = iso_ms(self.start + (day + 1) * DAY + 3600)
        return found

    def _close_days_before(self, day: int) -> Iterator[Record]:
        """Deposits of every settled batch older than ``day`` (rows come in time order)."""
        if day <= self.closed_day + 1:
            return
        for key in sorted(k for k in self.batches if k[1] < day):
            mid_index, batch_day = key
            net, rows = self.batches.pop(key)
            batch_id, funding = self._batch_ids(mid_index, batch_day)
            yield "deposit", {
                "deposit_id": self.ids.deposit_id + batch_day * len(MIDS) + mid_index,
                "mid": MIDS[mid_index],
                "deposit_date": self._settlement_date(batch_day),
                "amount_cents": net,
                "transaction_count": rows,
                "batch_id": batch_id,
                "funding_master_id": funding,
                "status": "FUNDED",
            }
        self.closed_day = day - 1

    # -- refunds ---------------------------------------------------------------------------
    def _plan_refund(self, sale: dict[str, Any], moment: float) -> None:
        rng = self.rng
        amount = sale["amount_cents"]
        partial = rng.random() < 0.4 and amount >= 200
        refund_cents = rng.randint(1, amount // 5) * 5 if partial else amount
        refund_cents = min(refund_cents, amount)
        sale["refunded_cents"] = refund_cents
        refunded = refund_cents == amount
        sale["trans_status_id"] = int(S.REFUNDED if refunded else S.PARTIALLY_REFUNDED)
        due = min(moment + rng.uniform(1, 20) * DAY, self.end - rng.uniform(1, 3600))
        due = max(due, moment + 1)
        refund = dict(sale)
        refund.update(
            related_trans_id=sale["trans_id"],
            amount_cents=refund_cents,
            authorized_cents=refund_cents,
            refunded_cents=0,
            resp_text="Refunded",
            trans_status_id=int(S.REFUND),
            auth_code=None,
            interchange_rate=None,
            interchange_per_item=None,
            **dict.fromkeys(("batch_id", "funded_batch_id", "funding_master_id")),
            settlement_date=None,
        )
        self.tickets += 1
        heapq.heappush(self.pending, (due, self.tickets, refund))

    def _due_refunds(self, until: float) -> Iterator[Record]:
        while self.pending and self.pending[0][0] <= until:
            due, _, refund = heapq.heappop(self.pending)
            refund["trans_id"] = str(self.ids.trans_id + self.produced)
            refund["trans_date"] = self._iso(due)
            if due < self.open_from:
                mid_index = MIDS.index(refund["mid"])
                self._settle(refund, mid_index, due, -refund["amount_cents"])
            self.produced += 1
            yield "transaction", refund

    # -- disputes and fees -----------------------------------------------------------------
    def _chargeback(
        self, sale: dict[str, Any], mid_index: int, moment: float, brand: int
    ) -> Iterator[Record]:
        rng = self.rng
        when = moment + rng.uniform(3, 45) * DAY
        if when >= self.end:
            return
        code, text = rng.choice(REASONS[brand])
        # Disputes older than a month have been decided; younger ones are still open.
        decided = self.end - when > 30 * DAY
        status = ("WON" if rng.random() < 0.4 else "LOST") if decided else "OPEN"
        number = self.chargebacks
        self.chargebacks += 1
        yield "chargeback", {
            "chargeback_id": str(CHARGEBACK_ID_START + number),
            "mid": sale["mid"],
            "trans_id": sale["trans_id"],
            "case_number": f"CB{iso_ms(when)[:4]}{number:06d}",
            "amount_cents": sale["amount_cents"],
            "reason_code": code,
            "reason_text": text,
            "chargeback_date": iso_ms(when),
            "status": status,
            "card_brand_id": brand,
            "card_number": sale["card_number"],
        }
        yield self._adjustment(
            mid_index, when, CHARGEBACK_FEE_CENTS, "chargeback_fee",
            f"Chargeback fee, case {iso_ms(when)[:4]}{number:06d}",
        )  # fmt: skip

    def _monthly_fees(self) -> Iterator[Record]:
        for day in range(WINDOW_DAYS - 1):
            if iso_ms(self.start + day * DAY)[8:10] != "01":
                continue
            for mid_index in range(len(MIDS)):
                when = self.start + day * DAY + 7200
                yield self._adjustment(
                    mid_index, when, MONTHLY_FEE_CENTS, "monthly_fee", "Monthly account fee"
                )

    def _adjustment(
        self, mid_index: int, when: float, cents: int, category: str, description: str
    ) -> Record:
        day = self._day(when)
        funding = self._batch_ids(mid_index, day)[1] if when < self.open_from else None
        number = self.adjustments
        self.adjustments += 1
        return "adjustment", {
            "adjustment_id": str(ADJUSTMENT_ID_START + number),
            "mid": MIDS[mid_index],
            "amount_cents": cents,
            "adjustment_date": iso_ms(when),
            "category": category,
            "description": description,
            "funding_master_id": funding,
        }


# -- storing ----------------------------------------------------------------------------------
def day_aligned_end(now: float) -> float:
    """The data set ends at the last UTC midnight, so one day's simulators agree on it."""
    return (now // DAY) * DAY


def seed_into(
    store: Store, ledger: Ledger, tables: ReportTables, seed: int, count: int, end: float
) -> dict[str, int]:
    """Generate the data set into the ledger and report tables; returns counts per kind.

    All or nothing: one bulk-load transaction, id blocks included.
    """
    buffers: dict[Kind, list[dict[str, Any]]] = {
        "transaction": [], "deposit": [], "chargeback": [], "adjustment": [],
    }  # fmt: skip
    writers = {
        "transaction": ledger.add_many,
        "deposit": ledger.add_deposits,
        "chargeback": tables.add_chargebacks,
        "adjustment": tables.add_adjustments,
    }
    counts: dict[str, int] = dict.fromkeys(buffers, 0)
    with store.bulk_load(), ledger.bulk_load():
        for kind, row in generate(seed, count, end, _reserve_ids(store, count)):
            buffer = buffers[kind]
            buffer.append(row)
            counts[kind] += 1
            if len(buffer) >= CHUNK_ROWS:
                writers[kind](buffer)
                buffer.clear()
        for kind, buffer in buffers.items():
            if buffer:
                writers[kind](buffer)
    return counts


def _reserve_ids(store: Store, count: int) -> IdBases:
    """Blocks of the ledger's sequences for ``count`` transactions and the window's batches."""
    slots = WINDOW_DAYS * len(MIDS)
    return IdBases(
        trans_id=store.reserve(TRANS_IDS.name, count, TRANS_IDS.start),
        batch_id=store.reserve(BATCH_IDS.name, slots, BATCH_IDS.start),
        funding=store.reserve(FUNDING_IDS.name, slots, FUNDING_IDS.start),
        deposit_id=store.reserve(DEPOSIT_IDS.name, slots, DEPOSIT_IDS.start),
    )


def ensure_seeded(ctx: SimContext, tables: ReportTables) -> None:
    """Seed once per store: a simulator restarted on its data directory keeps its data set."""
    if ctx.store.get_meta(META_KEY) is not None:
        return
    options = ctx.options
    end = day_aligned_end(ctx.clock.time())
    # The mark joins the load's transaction: a data set is either all there and marked, or not.
    with ctx.store.bulk_load():
        counts = seed_into(ctx.store, ctx.ledger, tables, options.seed, options.transactions, end)
        mark = {"seed": options.seed, "transactions": options.transactions, "end": end, **counts}
        ctx.store.set_meta(META_KEY, mark)
