"""How an MDB adapter writes amounts on its wire: plain data, apart from the wire protocol
(``mdb_protocol.py``, some dataclasses) so that checking an ``mdb`` trigger's ``amount_unit``
(``mdb_schema.py``: ``check-config``) waits for no more than this."""

from __future__ import annotations

import enum


class AmountUnit(enum.StrEnum):
    DOLLARS = "dollars"  # "2.50"
    CENTS = "cents"  # "250"
