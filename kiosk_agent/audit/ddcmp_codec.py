"""DDCMP messages: encoded, and decoded from the bytes on the wire, bounded. No I/O.

DEC's Digital Data Communications Message Protocol (DECnet DDCMP v4), as EVA-DTS uses it for
the audit: every message starts with an 8-byte header, the last two its CRC-16/ARC (low byte
first, ``crc.py``)::

    data     SOH 0x81  COUNT(14 bits, low byte first) + flags(QSYNC 0x40, SELECT 0x80)
                       RESP  NUM  ADDR  CRC(header)   then COUNT bytes and CRC(data)
    control  ENQ 0x05  TYPE  SUBTYPE(6 bits) + flags  RESP  NUM  ADDR  CRC(header)

Control types: ACK 1 (RESP: the last message received in sequence), NAK 2 (its subtype the
reason: 1 header CRC, 2 data CRC, 3 answer to a REP, 16 too long), REP 3 (NUM: the last message
sent, "did you get it?"), START 6, STACK 7. Maintenance messages (DLE 0x90) are framed like data
and dropped. Between messages an asynchronous line may idle with DEL 0xFF (or SYN 0x96): skipped.
Any other byte outside a message is garbage: counted, never kept.

A header whose CRC fails is reported once (``BadHeader``, answered NAK 1) and the bytes after its
first are looked at again, so a real message behind a false start is not lost. A data message
longer than ``max_data`` is refused before its data is read (``FramingError``): memory stays
bounded whatever the line says.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from kiosk_agent.audit.crc import crc16_arc, crc16_bytes_le

SOH, ENQ, DLE = 0x81, 0x05, 0x90
IDLE_FILL = frozenset({0xFF, 0x96})  # DEL (asynchronous idle), SYN
HEADER = 8
QSYNC, SELECT = 0x40, 0x80  # in the count byte's high bits
ADDRESS = 1  # a point-to-point link's station address
MAX_COUNT = (1 << 14) - 1
MAX_DATA = 1024  # what we accept in one data message (the audit comes in 240-byte blocks)


class ControlType(enum.IntEnum):
    ACK = 1
    NAK = 2
    REP = 3
    START = 6
    STACK = 7


class NakReason(enum.IntEnum):
    HEADER_CRC = 1
    DATA_CRC = 2
    REP_ANSWER = 3
    TOO_LONG = 16


@dataclass(frozen=True, slots=True)
class Control:
    type: ControlType
    subtype: int = 0  # a NAK's reason
    resp: int = 0
    num: int = 0


@dataclass(frozen=True, slots=True)
class Data:
    num: int
    resp: int
    data: bytes
    intact: bool  # its data CRC matched


@dataclass(frozen=True, slots=True)
class BadHeader:
    """A header whose CRC failed: the message it started is lost."""


Message = Control | Data | BadHeader


def _with_crc(header: bytes) -> bytes:
    return header + crc16_bytes_le(crc16_arc(header))


def encode_control(
    kind: ControlType, *, subtype: int = 0, resp: int = 0, num: int = 0, select: bool = True
) -> bytes:
    flags = SELECT if select else 0
    return _with_crc(bytes((ENQ, kind, (subtype & 0x3F) | flags, resp & 0xFF, num & 0xFF, ADDRESS)))


def encode_data(num: int, resp: int, data: bytes, *, select: bool = True) -> bytes:
    if len(data) > MAX_COUNT:
        raise ValueError(f"a DDCMP message carries at most {MAX_COUNT} bytes, not {len(data)}")
    count = len(data)
    flags = SELECT if select else 0
    header = bytes((SOH, count & 0xFF, (count >> 8) | flags, resp & 0xFF, num & 0xFF, ADDRESS))
    return _with_crc(header) + data + crc16_bytes_le(crc16_arc(data))


class FramingError(Exception):
    """The line broke the framing beyond recovery (a message longer than we take)."""


class _Where(enum.Enum):
    IDLE = "between messages"
    HEADER = "in a header"
    DATA = "in a message's data"


class Deframer:
    """Bytes in, messages out; one state enum and one setter."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        self.max_data = max_data
        self.garbage = 0  # bytes outside any message
        self._where = _Where.IDLE
        self._header = bytearray()
        self._data = bytearray()
        self._need = 0
        self._reported = False  # a bad header since the last good message was reported

    def _set(self, where: _Where) -> None:
        self._where = where

    def feed(self, data: bytes) -> list[Message]:
        messages: list[Message] = []
        pending = deque(data)
        while pending:
            message = self._byte(pending.popleft(), pending)
            if message is not None:
                messages.append(message)
        return messages

    def _byte(self, byte: int, pending: deque[int]) -> Message | None:
        where = self._where
        if where is _Where.IDLE:
            if byte in (SOH, ENQ, DLE):
                self._header = bytearray((byte,))
                self._set(_Where.HEADER)
            elif byte not in IDLE_FILL:
                self.garbage += 1
            return None
        if where is _Where.HEADER:
            self._header.append(byte)
            return self._header_done(pending) if len(self._header) == HEADER else None
        self._data.append(byte)
        if len(self._data) < self._need:
            return None
        self._set(_Where.IDLE)
        return self._data_done()

    def _header_done(self, pending: deque[int]) -> Message | None:
        header = bytes(self._header)
        self._set(_Where.IDLE)
        if crc16_arc(header) != 0:  # a header followed by its own CRC checks to zero
            pending.extendleft(reversed(header[1:]))  # look again behind the false start
            self.garbage += 1
            if self._reported:
                return None
            self._reported = True
            return BadHeader()
        if header[0] == ENQ:
            self._reported = False
            kind = header[1]
            if kind not in ControlType._value2member_map_:
                self.garbage += HEADER
                return None
            return Control(ControlType(kind), header[2] & 0x3F, header[3], header[4])
        count = header[1] | (header[2] & 0x3F) << 8
        if count > self.max_data:
            raise FramingError(
                f"a message of {count} bytes announced, more than the {self.max_data} we take"
            )
        self._data = bytearray()
        self._need = count + 2
        self._set(_Where.DATA)
        return None

    def _data_done(self) -> Message | None:
        self._reported = False
        header, body = self._header, bytes(self._data)
        if header[0] == DLE:  # a maintenance message: not ours
            return None
        data, check = body[:-2], body[-2:]
        intact = crc16_bytes_le(crc16_arc(data)) == check
        return Data(num=header[4], resp=header[3], data=data, intact=intact)
