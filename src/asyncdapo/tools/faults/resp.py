"""An incremental parser of the Redis wire protocol (RESP2 and RESP3), for the fault proxy.

The proxy must know where each command a client sends ends and where each reply Redis sends ends,
to pair them (one reply per command, in order) and to cut a connection exactly before a chosen
reply. `RespParser.feed(bytes)` returns every frame completed so far with its exact raw bytes;
bytes of an incomplete frame stay buffered until the rest arrives (pipelines and frames split
across reads both work).

Requests: arrays of bulk strings (what every client library sends) or inline commands (a plain
line, as typed into telnet). Replies: every RESP2 and RESP3 type; a RESP3 attribute (`|`) is kept
with the reply it annotates, and push frames (`>`, out-of-band) are flagged so the proxy does not
pair them with a command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RespProtocolError(ValueError):
    """The byte stream is not RESP (the proxy then stops parsing that connection)."""


@dataclass(frozen=True)
class RespErrorReply:
    """An error reply (`-ERR …` or a RESP3 blob error)."""

    message: str


@dataclass(frozen=True)
class Frame:
    raw: bytes  # the frame's exact bytes on the wire
    value: Any  # requests: list[bytes]; replies: bytes | str | int | float | bool | None | list | …
    push: bool = False  # a RESP3 push (out-of-band, answers no command)


class _Incomplete(Exception):
    pass


_LINE_TYPES = {ord(c) for c in "+-:_,#("}
_BULK_TYPES = {ord(c) for c in "$!="}
_AGG_TYPES = {ord(c) for c in "*~>%|"}


class RespParser:
    """Feed bytes of one direction of one connection; get the complete frames back."""

    def __init__(self, *, requests: bool, max_buffer: int = 512 << 20) -> None:
        self.requests = requests
        self.max_buffer = max_buffer
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame waiting for more input."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        pos = 0
        buf = bytes(self._buf)
        while pos < len(buf):
            try:
                if self.requests and buf[pos] != ord("*"):
                    value, end = _inline(buf, pos)
                    if not value:  # an empty line between commands carries nothing
                        pos = end
                        continue
                    push = False
                else:
                    push = buf[pos] == ord(">")
                    value, end = _value(buf, pos)
            except _Incomplete:
                break
            if self.requests and not _is_command(value):
                raise RespProtocolError(f"a request must be an array of bulk strings, got {value!r:.80}")
            frames.append(Frame(buf[pos:end], value, push))
            pos = end
        del self._buf[:pos]
        if len(self._buf) > self.max_buffer:
            raise RespProtocolError(f"incomplete frame over {self.max_buffer} bytes")
        return frames


def command_name(frame_value: Any) -> str:
    """Upper-case name of a parsed request (`EVALSHA`, `HSET`, …)."""
    return bytes(frame_value[0]).decode(errors="replace").upper() if frame_value else ""


def encode_command(*args: bytes | str | int) -> bytes:
    """A request as a RESP array of bulk strings (what a client library sends)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _is_command(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, bytes) for v in value)


def _line(buf: bytes, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    return buf[pos:end], end + 2


def _inline(buf: bytes, pos: int) -> tuple[list[bytes], int]:
    end = buf.find(b"\n", pos)
    if end < 0:
        raise _Incomplete
    return buf[pos:end].rstrip(b"\r").split(), end + 1


def _int(raw: bytes) -> int:
    try:
        return int(raw)
    except ValueError:
        raise RespProtocolError(f"expected an integer, got {raw[:40]!r}") from None


def _value(buf: bytes, pos: int) -> tuple[Any, int]:
    kind = buf[pos]
    if kind in _LINE_TYPES:
        line, end = _line(buf, pos + 1)
        c = chr(kind)
        if c == "+":
            return line.decode(errors="replace"), end
        if c == "-":
            return RespErrorReply(line.decode(errors="replace")), end
        if c in ":(":
            return _int(line), end
        if c == "_":
            return None, end
        if c == ",":
            return float(line), end
        return line == b"t", end  # '#'
    if kind in _BULK_TYPES:
        line, start = _line(buf, pos + 1)
        n = _int(line)
        if n < 0:
            return None, start
        end = start + n
        if len(buf) < end + 2:
            raise _Incomplete
        if buf[end : end + 2] != b"\r\n":
            raise RespProtocolError("bulk string not terminated by CRLF")
        data = buf[start:end]
        return (RespErrorReply(data.decode(errors="replace")) if kind == ord("!") else data), end + 2
    if kind in _AGG_TYPES:
        line, p = _line(buf, pos + 1)
        n = _int(line)
        if n < 0:
            return None, p
        if kind in (ord("%"), ord("|")):
            n *= 2
        items = []
        for _ in range(n):
            if p >= len(buf):
                raise _Incomplete
            item, p = _value(buf, p)
            items.append(item)
        if kind == ord("|"):  # an attribute annotates the reply that follows it: one frame
            if p >= len(buf):
                raise _Incomplete
            return _value(buf, p)
        return items, p
    raise RespProtocolError(f"unknown RESP type byte {bytes([kind])!r} at offset {pos}")
