"""DEX/UCS framing: the bytes on the wire turned into tokens, bounded. No I/O.

Outside a block a byte is a control: ENQ, EOT, NAK, or DLE followed by ``0``/``1`` (the
alternating acknowledgements). A block is ``DLE SOH`` (a handshake) or ``DLE STX`` (data), its
text (a DLE in it doubled), ``DLE ETB`` (more blocks follow) or ``DLE ETX`` (the last), then the
CRC-16/ARC of the text and the end byte, low byte first. Anything else outside a block is
garbage: counted, never kept. A block longer than ``max_block`` is a flood, not a block.

Also what the DEX/UCS and DDCMP stations share: the audit bounded in bytes, the tries bounded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kiosk_agent.audit.crc import crc16_arc, crc16_bytes_le
from kiosk_agent.audit.link_settings import DexTimeouts

ENQ, EOT, NAK = 0x05, 0x04, 0x15
DLE, SOH, STX, ETB, ETX = 0x10, 0x01, 0x02, 0x17, 0x03
ACK_BYTES = (b"\x100", b"\x101")  # DLE '0', DLE '1'
MAX_BLOCK = 512  # DEX/UCS blocks carry at most 245 characters; twice that with every DLE doubled


class Control(enum.Enum):
    ENQ = "ENQ"
    EOT = "EOT"
    NAK = "NAK"


@dataclass(frozen=True, slots=True)
class Ack:
    number: int  # 0 or 1


@dataclass(frozen=True, slots=True)
class Block:
    start: int  # SOH (handshake) or STX (data)
    text: bytes
    last: bool  # ended by ETX (else ETB)
    intact: bool  # its CRC matched


Token = Control | Ack | Block


def encode_block(text: bytes, *, start: int = STX, last: bool = True) -> bytes:
    end = ETX if last else ETB
    crc = crc16_arc(bytes((end,)), crc16_arc(text))
    stuffed = text.replace(bytes((DLE,)), bytes((DLE, DLE)))
    return bytes((DLE, start)) + stuffed + bytes((DLE, end)) + crc16_bytes_le(crc)


def keep_audit_text(audit: bytearray, text: bytes, max_audit: int) -> str:
    """Adds a block's ``text`` to the ``audit`` read so far, unless that would pass ``max_audit``
    bytes: then nothing is added and the reason is returned (both protocols' masters bound a read
    alike). An empty string means the text was kept."""
    if len(audit) + len(text) > max_audit:
        return f"the audit passed {max_audit} bytes"
    audit.extend(text)
    return ""


class RetryBound:
    """A station that sends again, up to ``timeouts.retries`` times, then gives up with the
    reason (both protocols' stations count their tries alike). The dataclass using it holds
    ``timeouts`` and ``_tries`` and says how it gives up."""

    timeouts: DexTimeouts
    _tries: int

    def _again(self, data: bytes, reason: str) -> bytes:
        self._tries += 1
        if self._tries > self.timeouts.retries:
            return self._give_up(f"{reason}, {self._tries} times")
        return data

    def _give_up(self, reason: str) -> bytes:
        raise NotImplementedError


class FramingError(Exception):
    """The line broke the framing beyond recovery (a block without end)."""


class _Where(enum.Enum):
    IDLE = "idle"
    AFTER_DLE = "after DLE"
    IN_BLOCK = "in a block"
    IN_BLOCK_AFTER_DLE = "after DLE in a block"
    CRC = "reading the CRC"


class Deframer:
    """Bytes in, tokens out; one state enum and one setter."""

    def __init__(self, max_block: int = MAX_BLOCK) -> None:
        self.max_block = max_block
        self.garbage = 0  # bytes outside any frame
        self._where = _Where.IDLE
        self._start = STX
        self._text = bytearray()
        self._end = ETX
        self._crc = bytearray()

    def _set(self, where: _Where) -> None:
        self._where = where

    def feed(self, data: bytes) -> list[Token]:
        tokens: list[Token] = []
        for byte in data:
            token = self._byte(byte)
            if token is not None:
                tokens.append(token)
        return tokens

    def _byte(self, byte: int) -> Token | None:
        where = self._where
        if where is _Where.IDLE:
            return self._idle(byte)
        if where is _Where.AFTER_DLE:
            return self._after_dle(byte)
        if where is _Where.IN_BLOCK:
            if byte == DLE:
                self._set(_Where.IN_BLOCK_AFTER_DLE)
            else:
                self._keep(byte)
            return None
        if where is _Where.IN_BLOCK_AFTER_DLE:
            return self._in_block_after_dle(byte)
        self._crc.append(byte)
        if len(self._crc) < 2:
            return None
        self._set(_Where.IDLE)
        return self._block()

    def _idle(self, byte: int) -> Token | None:
        if byte == DLE:
            self._set(_Where.AFTER_DLE)
            return None
        control = {ENQ: Control.ENQ, EOT: Control.EOT, NAK: Control.NAK}.get(byte)
        if control is None:
            self.garbage += 1
        return control

    def _after_dle(self, byte: int) -> Token | None:
        self._set(_Where.IDLE)
        if byte in (0x30, 0x31):
            return Ack(byte - 0x30)
        if byte in (SOH, STX):
            self._start = byte
            self._text.clear()
            self._set(_Where.IN_BLOCK)
            return None
        self.garbage += 2
        return None

    def _in_block_after_dle(self, byte: int) -> Token | None:
        if byte == DLE:
            self._keep(byte)
            self._set(_Where.IN_BLOCK)
        elif byte in (ETB, ETX):
            self._end = byte
            self._crc.clear()
            self._set(_Where.CRC)
        else:  # DLE then anything else inside a block: a broken frame; drop it
            self.garbage += len(self._text) + 2
            self._set(_Where.IDLE)
        return None

    def _keep(self, byte: int) -> None:
        if len(self._text) >= self.max_block:
            raise FramingError(f"a block of more than {self.max_block} bytes without its end")
        self._text.append(byte)

    def _block(self) -> Block:
        text = bytes(self._text)
        expected = crc16_arc(bytes((self._end,)), crc16_arc(text))
        intact = bytes(self._crc) == crc16_bytes_le(expected)
        return Block(self._start, text, self._end == ETX, intact)
