"""DDCMP, the audit read as EVA-DTS describes it: master (the agent) and slave (the machine).

Sans-I/O like ``dexucs.py``: each side is fed the bytes it heard (``receive``), told when its wait
ran out (``expire``), returns the bytes to send and says how long it waits next (``wait``).
``link.py`` runs the master over a serial port, ``virtual.py`` the slave on a pty.

Two layers. The link is DEC's DDCMP (``ddcmp_codec.py``): START until STACK, then numbered data
messages, one at a time each way (a window of one), each acknowledged (ACK, or the RESP of the
next data message); a message unacknowledged when the wait runs out is asked after with REP,
answered ACK (it came: the ACK was lost) or NAK 3 (it did not: sent again); a damaged message is
answered NAK 1 (header) or NAK 2 (data) and sent again. After START both sides count from 0: the
first message is 1, and 255 is followed by 0.

The application on top is our reading of EVA-DTS's prose (docs/audit-link.md says which is
which): the master asks "who are you" (``WHO``, with its communication id), the machine answers
its identity (``IDENTITY``: response code ``00`` and its id), the master asks to read the audit
(``READ``), the machine sends it in numbered blocks (``BLOCK``: number, last or not, up to 240
bytes), each acknowledged, and the master ends with ``FINISH``. The first byte of each data
message says which; the bytes are ours, not EVA-DTS's (which we could not read).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from kiosk_agent.audit.ddcmp_codec import (
    BadHeader,
    Control,
    ControlType,
    Data,
    Deframer,
    FramingError,
    Message,
    NakReason,
    encode_control,
    encode_data,
)
from kiosk_agent.audit.dexucs import ACCEPTED, SlaveFaults, comm_id_bytes
from kiosk_agent.audit.framing import RetryBound, keep_audit_text
from kiosk_agent.audit.link_settings import AGENT_COMM_ID, MACHINE_COMM_ID, DexTimeouts

BLOCK_TEXT = 240  # bytes of audit per BLOCK message
MAX_GARBAGE = 16 << 10  # bytes heard since the last good message before the read gives up


class App(enum.IntEnum):
    """The first byte of a data message: what it carries (ours, see the module's docstring)."""

    WHO = 0x01  # master: who are you? + its communication id (10)
    IDENTITY = 0x02  # slave: response code (2) + its communication id (10)
    READ = 0x03  # master: send the audit
    BLOCK = 0x04  # slave: block number (2, high byte first) + last (1: 0 or 1) + text
    FINISH = 0x05  # master: the read is over


def block_message(number: int, text: bytes, *, last: bool) -> bytes:
    return bytes((App.BLOCK, number >> 8 & 0xFF, number & 0xFF, int(last))) + text


def _next(number: int) -> int:
    return (number + 1) & 0xFF  # DEC's numbers count modulo 256: 255 is followed by 0


@dataclass
class _Station(RetryBound):
    """One end of a DDCMP link: the sequence numbers, the message awaiting its ACK, and the
    answers every state gives alike (ACK, NAK, REP). The master and the slave add their own."""

    timeouts: DexTimeouts = field(default_factory=DexTimeouts)
    sent: int = 0  # NUM of the last data message sent
    received: int = 0  # NUM of the last data message received in sequence
    _unacked: bytes = b""  # the last data message sent, until acknowledged
    _deframer: Deframer = field(default_factory=Deframer)
    _tries: int = 0

    @property
    def garbage(self) -> int:
        return self._deframer.garbage

    def _send(self, payload: bytes) -> bytes:
        self.sent = _next(self.sent)
        self._unacked = encode_data(self.sent, self.received, payload)
        self._tries = 0
        return self._unacked

    def _ack(self) -> bytes:
        return encode_control(ControlType.ACK, resp=self.received)

    def _acked_by(self, resp: int) -> bool:
        """RESP acknowledges our last message: it is off our hands."""
        if self._unacked and resp == self.sent:
            self._unacked = b""
            self._tries = 0
            return True
        return False

    def _link(self, message: Message) -> tuple[bytes, Data | None]:
        """What the link layer answers, and the new data message to hand up (once each)."""
        if isinstance(message, BadHeader):
            nak = encode_control(ControlType.NAK, subtype=NakReason.HEADER_CRC, resp=self.received)
            return self._again(nak, f"{self._due()} failed its header CRC"), None
        if isinstance(message, Control):
            return self._control(message), None
        if not message.intact:
            nak = encode_control(ControlType.NAK, subtype=NakReason.DATA_CRC, resp=self.received)
            return self._again(nak, f"{self._due()} failed its data CRC"), None
        self._acked_by(message.resp)
        if message.num == self.received:  # again: our ACK was lost
            return self._ack(), None
        if message.num != _next(self.received):
            return b"", None  # out of sequence: ignored, the sender asks again (REP)
        self.received = message.num
        return self._ack(), message

    def _control(self, message: Control) -> bytes:
        if message.type is ControlType.ACK:
            self._acked_by(message.resp)
        elif message.type is ControlType.NAK and self._unacked:
            return self._again(self._unacked, f"the machine refused a message ({_nak(message)})")
        elif message.type is ControlType.REP:
            if message.num == self.received:
                return self._ack()
            return encode_control(
                ControlType.NAK, subtype=NakReason.REP_ANSWER, resp=self.received
            )
        return b""

    def _due(self) -> str:
        """The message expected next, in words."""
        return f"message {_next(self.received)}"

    def _rep(self) -> bytes:
        return encode_control(ControlType.REP, num=self.sent)


def _nak(message: Control) -> str:
    try:
        return f"NAK: {NakReason(message.subtype).name.lower().replace('_', ' ')}"
    except ValueError:
        return f"NAK {message.subtype}"


class MasterPhase(enum.StrEnum):
    STARTING = "starting the link: waiting for STACK"
    IDENTIFYING = "waiting for the machine's identity"
    ASKING = "asking for the audit"
    RECEIVING = "receiving the audit"
    FINISHING = "waiting for the machine to take FINISH"
    DONE = "done"
    FAILED = "failed"


ENDED = frozenset({MasterPhase.DONE, MasterPhase.FAILED})
BLOCK_DUE = frozenset({MasterPhase.ASKING, MasterPhase.RECEIVING})  # the machine makes a block


@dataclass
class DdcmpMaster(_Station):
    """The agent's side: reads one audit, bounded in bytes (``max_audit``) and tries."""

    comm_id: str = AGENT_COMM_ID
    max_audit: int = 1 << 20
    max_garbage: int = MAX_GARBAGE
    phase: MasterPhase = MasterPhase.STARTING
    failure: str = ""
    machine_id: str = ""
    blocks: int = 0
    refused_blocks: int = 0  # damaged messages refused (NAK) and sent again
    _audit: bytearray = field(default_factory=bytearray)
    _heard_since_good: int = 0  # bytes heard since the last message decoded

    def _set(self, phase: MasterPhase) -> None:
        self.phase = phase
        self._tries = 0

    @property
    def audit(self) -> bytes:
        return bytes(self._audit)

    @property
    def wait(self) -> float | None:
        if self.phase in ENDED:
            return None
        return self.timeouts.block if self.phase in BLOCK_DUE else self.timeouts.answer

    def start(self) -> bytes:
        self._set(MasterPhase.STARTING)
        return encode_control(ControlType.START)

    def fail(self, reason: str) -> bytes:
        if self.phase not in ENDED:
            self.failure = f"{reason} ({self.phase.value})"
            self._set(MasterPhase.FAILED)
        return b""

    _give_up = fail

    def _due(self) -> str:
        if self.phase in (MasterPhase.ASKING, MasterPhase.RECEIVING):
            return f"block {self.blocks + 1}"
        return super()._due()

    def receive(self, data: bytes) -> bytes:
        try:
            messages = self._deframer.feed(data)
        except FramingError as err:
            return self.fail(str(err))
        out = b"".join(self._message(m) for m in messages if self.phase not in ENDED)
        self._heard_since_good = 0 if messages else self._heard_since_good + len(data)
        if self._heard_since_good > self.max_garbage and self.phase not in ENDED:
            return out + self.fail(
                f"{self._heard_since_good} bytes heard without one DDCMP message: the port "
                "floods or answers garbage"
            )
        return out

    def _message(self, message: Message) -> bytes:
        if isinstance(message, BadHeader) or (isinstance(message, Data) and not message.intact):
            self.refused_blocks += 1
        if self.phase is MasterPhase.STARTING:
            if isinstance(message, Control) and message.type is ControlType.STACK:
                self._set(MasterPhase.IDENTIFYING)
                return self._ack() + self._send(bytes((App.WHO,)) + comm_id_bytes(self.comm_id))
            return b""
        if isinstance(message, Control) and message.type is ControlType.STACK:
            return self._ack()  # our ACK of STACK was lost
        reply, data = self._link(message)
        if self.phase in ENDED:
            return reply
        return reply + (self._app(data) if data is not None else self._progress())

    def _progress(self) -> bytes:
        """The FINISH acknowledged: done."""
        if self.phase is MasterPhase.FINISHING and not self._unacked:
            self._set(MasterPhase.DONE)
        return b""

    def _app(self, message: Data) -> bytes:
        kind, body = message.data[:1], message.data[1:]
        if self.phase is MasterPhase.IDENTIFYING and kind == bytes((App.IDENTITY,)):
            code, machine_id = body[:2], body[2:12]
            if code != ACCEPTED:
                return self.fail(f"the machine refused the read (response code {code!r})")
            self.machine_id = machine_id.decode("ascii", "replace").strip()
            self._set(MasterPhase.ASKING)
            return self._send(bytes((App.READ,)))
        if self.phase in (MasterPhase.ASKING, MasterPhase.RECEIVING) and kind == bytes(
            (App.BLOCK,)
        ):
            return self._block(body)
        return self._progress()

    def _block(self, body: bytes) -> bytes:
        if len(body) < 3:
            return self.fail(f"block {self.blocks + 1} is too short to be a block")
        number, last, text = body[0] << 8 | body[1], body[2] == 1, body[3:]
        if number != self.blocks + 1:
            return self.fail(f"block {number} came where block {self.blocks + 1} was due")
        if refused := keep_audit_text(self._audit, text, self.max_audit):
            return self.fail(refused)
        self.blocks += 1
        if not last:
            self._set(MasterPhase.RECEIVING)
            return b""
        self._set(MasterPhase.FINISHING)
        return self._send(bytes((App.FINISH,)))

    def expire(self) -> bytes:
        """The wait ran out: ask again (START, or REP for our message), or end the read."""
        phase = self.phase
        if phase is MasterPhase.STARTING:
            return self._again(
                encode_control(ControlType.START),
                "no answer to START: is the DEX cable in, the machine on, and does it speak DDCMP?",
            )
        if self._unacked:
            return self._again(self._rep(), f"no acknowledgement of message {self.sent}")
        if phase is MasterPhase.RECEIVING:
            return self._again(self._ack(), f"the machine stalled after block {self.blocks}")
        return self._again(b"", "the machine fell silent")


class SlavePhase(enum.StrEnum):
    IDLE = "waiting for START"
    RUNNING = "waiting for the master's request"
    SENDING = "waiting for the acknowledgement of a block"
    DONE = "done"


@dataclass
class DdcmpFaults(SlaveFaults):
    """Beside the DEX slave's faults (a block's data CRC broken, an ACK unheard, a stall): a
    block's header CRC broken, a block lost on the line (each the first sending only), and a
    slow machine (each block sent ``slow_blocks`` seconds after the last one's ACK)."""

    corrupt_headers: set[int] = field(default_factory=set)
    lose_blocks: set[int] = field(default_factory=set)
    slow_blocks: float = 0.0


@dataclass
class DdcmpSlave(_Station):
    """The machine's side: answers each read with ``audit`` (or what the callable gives when the
    read is asked for)."""

    audit: bytes | Callable[[], bytes] = b""
    comm_id: str = MACHINE_COMM_ID
    faults: SlaveFaults = field(default_factory=SlaveFaults)
    phase: SlavePhase = SlavePhase.IDLE
    reads: int = 0
    _current: bytes = b""
    _block: int = 0  # the block last sent (1-based)
    _sent_blocks: set[int] = field(default_factory=set)
    _held: bytes = b""  # a block the slow machine has not sent yet

    def _set(self, phase: SlavePhase) -> None:
        self.phase = phase
        self._tries = 0

    def _give_up(self, reason: str) -> bytes:
        self._set(SlavePhase.IDLE)
        return b""

    @property
    def stalled(self) -> bool:
        return self.faults.stall_after is not None and self._block >= self.faults.stall_after

    @property
    def wait(self) -> float | None:
        if self._held:
            return self._slowness()
        if self.phase in (SlavePhase.IDLE, SlavePhase.DONE) or self.stalled or not self._unacked:
            return None
        return self.timeouts.answer

    def _slowness(self) -> float:
        return self.faults.slow_blocks if isinstance(self.faults, DdcmpFaults) else 0.0

    @property
    def block_count(self) -> int:
        return max(1, -(-len(self._current) // BLOCK_TEXT))

    def reset(self) -> None:
        """Back to waiting for START, whatever was half heard (another protocol's bytes)."""
        self._deframer = Deframer()
        self._unacked = self._held = b""
        self._set(SlavePhase.IDLE)

    def receive(self, data: bytes) -> bytes:
        try:
            messages = self._deframer.feed(data)
        except FramingError:
            self._set(SlavePhase.IDLE)
            return b""
        return b"".join(self._message(m) for m in messages)

    def _message(self, message: Message) -> bytes:
        if self.stalled:
            return b""
        if isinstance(message, Control) and message.type is ControlType.START:
            self.sent = self.received = 0
            self._unacked = self._held = b""
            self._set(SlavePhase.RUNNING)
            return encode_control(ControlType.STACK)
        if self.phase is SlavePhase.IDLE:
            return b""
        if self._ack_lost(message):
            return self._rep()  # as if the line lost it and our wait ran out: we ask
        reply, data = self._link(message)
        if data is not None:
            return reply + self._app(data)
        if self.phase is SlavePhase.SENDING and not self._unacked:
            return reply + self._next_block()
        return reply

    def _ack_lost(self, message: Message) -> bool:
        """The fault: the first acknowledgement of a block never reaches us."""
        block = self._block
        if (
            self.phase is SlavePhase.SENDING
            and block in self.faults.lose_acks
            and isinstance(message, Control)
            and message.type is ControlType.ACK
            and message.resp == self.sent
        ):
            self.faults.lose_acks.discard(block)
            return True
        return False

    def _app(self, message: Data) -> bytes:
        kind = message.data[:1]
        if kind == bytes((App.WHO,)):
            return self._send(bytes((App.IDENTITY,)) + ACCEPTED + comm_id_bytes(self.comm_id))
        if kind == bytes((App.READ,)):
            self._current = self.audit() if callable(self.audit) else self.audit
            self._block = 0
            self._sent_blocks.clear()
            self._set(SlavePhase.SENDING)
            return self._next_block() if not self._unacked else b""
        if kind == bytes((App.FINISH,)):
            self.reads += 1
            self._set(SlavePhase.DONE)
        return b""

    def _next_block(self) -> bytes:
        if self._block >= self.block_count:
            self._set(SlavePhase.RUNNING)  # the last block is in: FINISH comes next
            return b""
        self._block += 1
        number = self._block
        text = self._current[(number - 1) * BLOCK_TEXT : number * BLOCK_TEXT]
        frame = self._faulty(
            number, self._send(block_message(number, text, last=number == self.block_count))
        )
        if self._slowness():
            self._held = frame  # sent when the slow machine's wait runs out
            return b""
        return frame

    def _faulty(self, number: int, frame: bytes) -> bytes:
        """The first sending of a block, as the faults asked (later ones go as they are)."""
        if number in self._sent_blocks:
            return frame
        self._sent_blocks.add(number)
        faults = self.faults
        if isinstance(faults, DdcmpFaults):
            if number in faults.lose_blocks:
                return self._rep()  # lost on the line; our wait for its ACK ran out: we ask
            if number in faults.corrupt_headers:
                return frame[:6] + bytes((frame[6] ^ 0xFF,)) + frame[7:]
        if number in faults.corrupt_blocks:
            return frame[:-1] + bytes((frame[-1] ^ 0xFF,))
        return frame

    def expire(self) -> bytes:
        """A slow machine's block is ready; or no acknowledgement: ask with REP, then give the
        read up."""
        if self._held:
            held, self._held = self._held, b""
            return held
        return self._again(self._rep(), "no acknowledgement") if self._unacked else b""
