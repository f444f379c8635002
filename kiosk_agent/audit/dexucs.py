"""DEX/UCS, the audit read over the machine's DEX jack: master (the agent) and slave (the machine).

Sans-I/O: each side is a state machine fed the bytes it heard (``receive``) and told when its
wait ran out (``expire``); each returns the bytes to send, and says how long it waits next
(``wait``, seconds on the caller's monotonic clock). ``link.py`` runs them over a serial port.

The exchange (9600 8N1), master ``>``, slave ``<``::

    first handshake    > ENQ   < DLE 0   > DLE SOH <comm id 10> R <R00L06> DLE ETX CRC
                       < DLE 1   > EOT
    second handshake   < ENQ   > DLE 0   < DLE SOH 00 <comm id 10> <R00L06> DLE ETX CRC
                       > DLE 1   < EOT
    data               < ENQ   > DLE 0   < DLE STX <up to 245 bytes> DLE ETB CRC   > DLE 1
                       < DLE STX ... DLE ETB CRC   > DLE 0   ...   < ... DLE ETX CRC
                       > DLE 0|1   < EOT

A block whose CRC fails is answered NAK and sent again; a slave that heard no acknowledgement
sends ENQ and the master repeats its last one. Every wait is bounded and retried a few times;
then the read ends with the reason (``failure``). Followed: the DEX/UCS description in EVA-DTS
6.1 (section 2) and the public DEX slaves and masters read for the byte order of the handshakes
(docs/audit-link.md names them).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from kiosk_agent.audit.framing import (
    ACK_BYTES,
    EOT,
    NAK,
    SOH,
    Ack,
    Block,
    Control,
    Deframer,
    FramingError,
    RetryBound,
    Token,
    encode_block,
    keep_audit_text,
)
from kiosk_agent.audit.link_settings import AGENT_COMM_ID, MACHINE_COMM_ID, DexTimeouts

ENQ_BYTE = b"\x05"
EOT_BYTE = bytes((EOT,))
NAK_BYTE = bytes((NAK,))
BLOCK_TEXT = 245  # characters of audit per data block
REVISION = b"R00L06"
READ = b"R"
ACCEPTED = b"00"


def comm_id_bytes(comm_id: str) -> bytes:
    """A communication id is 10 characters on the wire: padded, or the first 10."""
    return comm_id.encode("ascii", "replace")[:10].ljust(10, b"0")


class MasterPhase(enum.StrEnum):
    FIRST_ENQ = "first handshake: waiting for DLE 0"
    IDENTITY_SENT = "first handshake: waiting for DLE 1"
    SECOND_ENQ = "second handshake: waiting for the machine's ENQ"
    SLAVE_IDENTITY = "second handshake: waiting for the machine's identity"
    HANDSHAKE_EOT = "second handshake: waiting for EOT"
    DATA_ENQ = "waiting for the machine to start sending"
    RECEIVING = "receiving the audit"
    FINAL_EOT = "waiting for EOT after the last block"
    DONE = "done"
    FAILED = "failed"


ENDED = frozenset({MasterPhase.DONE, MasterPhase.FAILED})


@dataclass
class DexMaster(RetryBound):
    """The agent's side: reads one audit, bounded in bytes (``max_audit``) and tries."""

    comm_id: str = AGENT_COMM_ID
    timeouts: DexTimeouts = field(default_factory=DexTimeouts)
    max_audit: int = 1 << 20
    phase: MasterPhase = MasterPhase.FIRST_ENQ
    failure: str = ""
    machine_id: str = ""  # the slave's communication id
    blocks: int = 0
    refused_blocks: int = 0  # NAKs sent
    _audit: bytearray = field(default_factory=bytearray)
    _deframer: Deframer = field(default_factory=Deframer)
    _tries: int = 0
    _last_ack: int = 0

    def _set(self, phase: MasterPhase) -> None:
        self.phase = phase
        self._tries = 0

    @property
    def audit(self) -> bytes:
        return bytes(self._audit)

    @property
    def wait(self) -> float | None:
        """Seconds to wait for the next byte; None once the read has ended."""
        if self.phase in ENDED:
            return None
        return self.timeouts.block if self.phase is MasterPhase.RECEIVING else self.timeouts.answer

    @property
    def garbage(self) -> int:
        return self._deframer.garbage

    def start(self) -> bytes:
        self._set(MasterPhase.FIRST_ENQ)
        return ENQ_BYTE

    def fail(self, reason: str) -> bytes:
        if self.phase not in ENDED:
            self.failure = f"{reason} ({self.phase.value})"
            self._set(MasterPhase.FAILED)
        return b""

    _give_up = fail

    def receive(self, data: bytes) -> bytes:
        try:
            tokens = self._deframer.feed(data)
        except FramingError as err:
            return self.fail(str(err))
        return b"".join(self._token(token) for token in tokens if self.phase not in ENDED)

    def _token(self, token: Token) -> bytes:
        phase = self.phase
        if phase is MasterPhase.FIRST_ENQ and token == Ack(0):
            self._set(MasterPhase.IDENTITY_SENT)
            return self._identity()
        if phase is MasterPhase.IDENTITY_SENT:
            if token == Ack(1):
                self._set(MasterPhase.SECOND_ENQ)
                return EOT_BYTE
            if token is Control.NAK:
                return self._again(self._identity(), "the machine refused our identity")
        if phase is MasterPhase.SECOND_ENQ and token is Control.ENQ:
            self._set(MasterPhase.SLAVE_IDENTITY)
            return ACK_BYTES[0]
        if phase is MasterPhase.SLAVE_IDENTITY:
            if isinstance(token, Block):
                return self._slave_identity(token)
            if token is Control.ENQ:
                return ACK_BYTES[0]
        if phase is MasterPhase.HANDSHAKE_EOT and token is Control.EOT:
            self._set(MasterPhase.DATA_ENQ)
            return b""
        if phase is MasterPhase.DATA_ENQ and token is Control.ENQ:
            self._set(MasterPhase.RECEIVING)
            self._last_ack = 0
            return ACK_BYTES[0]
        if phase in (MasterPhase.RECEIVING, MasterPhase.FINAL_EOT):
            return self._transfer(token)
        return b""  # a stray byte where none is expected: the wait's timeout covers it

    def _identity(self) -> bytes:
        text = comm_id_bytes(self.comm_id) + READ + REVISION
        return encode_block(text, start=SOH)

    def _slave_identity(self, block: Block) -> bytes:
        if not block.intact or block.start != SOH:
            return self._again(NAK_BYTE, "the machine's identity arrived damaged")
        code, machine_id = block.text[:2], block.text[2:12]
        if code != ACCEPTED:
            return self.fail(f"the machine refused the read (response code {code!r})")
        self.machine_id = machine_id.decode("ascii", "replace").strip()
        self._set(MasterPhase.HANDSHAKE_EOT)
        return ACK_BYTES[1]

    def _transfer(self, token: Token) -> bytes:
        if token is Control.ENQ:  # our acknowledgement was lost: say it again
            return ACK_BYTES[self._last_ack]
        if token is Control.EOT:
            if self.phase is MasterPhase.FINAL_EOT:
                self._set(MasterPhase.DONE)
                return b""
            return self.fail(f"the machine ended the transfer after {self.blocks} blocks")
        if not isinstance(token, Block) or self.phase is MasterPhase.FINAL_EOT:
            return b""
        if not token.intact:
            self.refused_blocks += 1
            return self._again(NAK_BYTE, f"block {self.blocks + 1} failed its CRC")
        if refused := keep_audit_text(self._audit, token.text, self.max_audit):
            return self.fail(refused)
        self.blocks += 1
        self._last_ack = self.blocks % 2
        if token.last:
            self._set(MasterPhase.FINAL_EOT)
        else:
            self._tries = 0
        return ACK_BYTES[self._last_ack]

    def expire(self) -> bytes:
        """The wait ran out: try again, or end the read with the reason."""
        phase = self.phase
        if phase is MasterPhase.FIRST_ENQ:
            return self._again(
                ENQ_BYTE,
                "no answer to ENQ: is the DEX cable in, the machine on, and does it speak DEX/UCS?",
            )
        if phase is MasterPhase.IDENTITY_SENT:
            return self._again(self._identity(), "no answer to our identity")
        if phase is MasterPhase.FINAL_EOT:
            self._set(MasterPhase.DONE)  # every block is in; a lost EOT loses nothing
            return b""
        if phase is MasterPhase.RECEIVING:
            return self._again(
                ACK_BYTES[self._last_ack], f"the machine stalled after block {self.blocks}"
            )
        return self._again(b"", "the machine fell silent")


class SlavePhase(enum.StrEnum):
    IDLE = "waiting for ENQ"
    MASTER_IDENTITY = "waiting for the master's identity"
    FIRST_EOT = "waiting for EOT"
    SECOND_ACK0 = "waiting for DLE 0 to our ENQ"
    IDENTITY_SENT = "waiting for DLE 1 to our identity"
    DATA_ACK0 = "waiting for DLE 0 to our data ENQ"
    SENDING = "waiting for the acknowledgement of a block"
    DONE = "done"


@dataclass
class SlaveFaults:
    """What the virtual machine gets wrong on purpose (block numbers count from 1)."""

    corrupt_blocks: set[int] = field(default_factory=set)  # the first sending of each: bad CRC
    lose_acks: set[int] = field(default_factory=set)  # the first acknowledgement of each: unheard
    stall_after: int | None = None  # after sending this block, say nothing more


@dataclass
class DexSlave:
    """The machine's side: answers each read with ``audit``, or what it gives when it is a
    callable (the machine's counters as they are when a read's data starts)."""

    audit: bytes | Callable[[], bytes]
    comm_id: str = MACHINE_COMM_ID
    faults: SlaveFaults = field(default_factory=SlaveFaults)
    timeouts: DexTimeouts = field(default_factory=DexTimeouts)
    phase: SlavePhase = SlavePhase.IDLE
    reads: int = 0  # reads completed
    _deframer: Deframer = field(default_factory=Deframer)
    _current: bytes = b""  # this read's audit
    _block: int = 0  # the block last sent (1-based)
    _sent: set[int] = field(default_factory=set)
    _tries: int = 0

    def _set(self, phase: SlavePhase) -> None:
        self.phase = phase
        self._tries = 0

    @property
    def wait(self) -> float | None:
        if self.phase in (SlavePhase.IDLE, SlavePhase.DONE) or self.stalled:
            return None
        return self.timeouts.answer

    @property
    def block_count(self) -> int:
        return max(1, -(-len(self._current) // BLOCK_TEXT))

    def reset(self) -> None:
        """Back to waiting for a read, whatever was half heard (another protocol's bytes)."""
        self._deframer = Deframer()
        self._set(SlavePhase.IDLE)

    def receive(self, data: bytes) -> bytes:
        try:
            tokens = self._deframer.feed(data)
        except FramingError:
            self._set(SlavePhase.IDLE)
            return b""
        return b"".join(self._token(token) for token in tokens)

    @property
    def stalled(self) -> bool:
        return self.faults.stall_after is not None and self._block >= self.faults.stall_after

    def _token(self, token: Token) -> bytes:
        phase = self.phase
        if self.stalled:
            return b""
        if token is Control.ENQ and phase in (SlavePhase.IDLE, SlavePhase.DONE):
            self._set(SlavePhase.MASTER_IDENTITY)
            return ACK_BYTES[0]
        if phase is SlavePhase.MASTER_IDENTITY and isinstance(token, Block):
            if not token.intact:
                return NAK_BYTE
            self._set(SlavePhase.FIRST_EOT)
            return ACK_BYTES[1]
        if phase is SlavePhase.FIRST_EOT and token is Control.EOT:
            self._set(SlavePhase.SECOND_ACK0)
            return ENQ_BYTE
        if phase is SlavePhase.SECOND_ACK0 and token == Ack(0):
            self._set(SlavePhase.IDENTITY_SENT)
            return self._identity()
        if phase is SlavePhase.IDENTITY_SENT:
            if token == Ack(1):
                self._set(SlavePhase.DATA_ACK0)
                return EOT_BYTE + ENQ_BYTE
            if token is Control.NAK:
                return self._identity()
        if phase is SlavePhase.DATA_ACK0 and token == Ack(0):
            self._current = self.audit() if callable(self.audit) else self.audit
            self._block = 0
            self._sent.clear()
            self._set(SlavePhase.SENDING)
            return self._next_block()
        if phase is SlavePhase.SENDING:
            return self._acknowledged(token)
        return b""

    def _identity(self) -> bytes:
        return encode_block(ACCEPTED + comm_id_bytes(self.comm_id) + REVISION, start=SOH)

    def _acknowledged(self, token: Token) -> bytes:
        if token is Control.NAK:
            return self._send(self._block)
        if not isinstance(token, Ack) or token.number != self._block % 2:
            return b""
        if self._block in self.faults.lose_acks:
            self.faults.lose_acks.discard(self._block)
            return ENQ_BYTE  # as if the line lost it and our wait ran out: we ask again
        return self._next_block()

    def _next_block(self) -> bytes:
        if self._block >= self.block_count:
            self.reads += 1
            self._set(SlavePhase.DONE)
            return EOT_BYTE
        self._tries = 0
        return self._send(self._block + 1)

    def _send(self, number: int) -> bytes:
        self._block = number
        text = self._current[(number - 1) * BLOCK_TEXT : number * BLOCK_TEXT]
        frame = encode_block(text, last=number == self.block_count)
        if number in self.faults.corrupt_blocks and number not in self._sent:
            frame = frame[:-1] + bytes((frame[-1] ^ 0xFF,))
        self._sent.add(number)
        return frame

    def expire(self) -> bytes:
        """No answer: ask for the last acknowledgement again (ENQ), then give the read up."""
        self._tries += 1
        if self._tries > self.timeouts.retries:
            self._set(SlavePhase.IDLE)
            return b""
        return ENQ_BYTE if self.phase is SlavePhase.SENDING else b""
