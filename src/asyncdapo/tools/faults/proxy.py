"""A TCP fault proxy: between a client and Redis (RESP-aware) or a client and a gRPC server (raw).

Faults it injects, each the way a network or a crashed peer would:
- `cut_all()`: reset every open connection now (RST, as a dead peer or a dropped NAT entry);
- `refuse_for(s)`: stop listening for `s` seconds (clients get ECONNREFUSED), after cutting
  every connection; then listen again on the same port;
- `lose_reply(predicate, nth)` (RESP mode): after forwarding the `nth` client command matching
  `predicate` (counted over every connection), let Redis execute it but, when its reply comes
  back, drop the connection instead of forwarding that reply. Replies to earlier commands of the
  same pipeline are forwarded first, so exactly the chosen command's reply (and whatever was
  pipelined after it) is lost. A matching command inside MULTI is lost at its EXEC (that is when
  Redis acts on it).

Predicates: `evalsha("finish")` (the scheduler's Lua scripts by name, their SHA-1 computed from
`asyncdapo.services.scheduler.lua`, or any SHA-1; EVAL of the same text matches too) and
`command("XACK", …)` (plain commands by name).

`FaultProxy` is asyncio; `ProxyThread` runs one in a background thread for synchronous tests
and harnesses. Only ever listens on 127.0.0.1 by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from asyncdapo.tools.faults.resp import Frame, RespParser, RespProtocolError, command_name

log = logging.getLogger(__name__)
T = TypeVar("T")

Predicate = Callable[[list[bytes]], bool]


def script_sha(name: str) -> str:
    """SHA-1 of one of the scheduler's Lua scripts (`claim`, `record`, `finish`, …), as EVALSHA sends it."""
    from asyncdapo.services.scheduler.lua import SCRIPTS

    try:
        text = SCRIPTS[name]
    except KeyError:
        raise KeyError(f"no scheduler script {name!r}; known: {sorted(SCRIPTS)}") from None
    return hashlib.sha1(text.encode()).hexdigest()


def evalsha(script: str) -> Predicate:
    """Matches EVALSHA of `script` (a scheduler script name or a SHA-1), and EVAL of its text."""
    sha = script.lower() if len(script) == 40 and all(c in "0123456789abcdefABCDEF" for c in script) else None
    sha = sha or script_sha(script)

    def match(cmd: list[bytes]) -> bool:
        name = command_name(cmd)
        if len(cmd) < 2:
            return False
        if name == "EVALSHA":
            return cmd[1].decode(errors="replace").lower() == sha
        if name == "EVAL":
            return hashlib.sha1(cmd[1]).hexdigest() == sha
        return False

    match.__name__ = f"evalsha({script})"
    return match


def command(*names: str) -> Predicate:
    """Matches client commands by name (case-insensitive)."""
    wanted = {n.upper() for n in names}

    def match(cmd: list[bytes]) -> bool:
        return command_name(cmd) in wanted

    match.__name__ = f"command({', '.join(sorted(wanted))})"
    return match


@dataclass
class LostReplyRule:
    """One armed `lose_reply`: fires once, on the `nth` match."""

    predicate: Predicate
    nth: int
    matches: int = 0
    fired: threading.Event = field(default_factory=threading.Event)
    lost_command: list[bytes] | None = None  # the command whose reply was lost

    def wait(self, timeout_s: float) -> bool:
        """Block until the reply was lost (True) or `timeout_s` passed (False)."""
        return self.fired.wait(timeout_s)


@dataclass
class _Pending:
    cmd: list[bytes]
    rule: LostReplyRule | None = None  # lose this command's reply


@dataclass
class ProxyStats:
    connections: int = 0
    commands: int = 0
    replies: int = 0
    cuts: int = 0
    lost_replies: int = 0
    upstream_failures: int = 0


class _Conn:
    def __init__(self, proxy: FaultProxy, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.cr, self.cw = cr, cw
        self.sr: asyncio.StreamReader | None = None
        self.sw: asyncio.StreamWriter | None = None
        self.pending: deque[_Pending] = deque()
        self.in_multi = False
        self.multi_doom: LostReplyRule | None = None
        self.closed = False

    async def run(self) -> None:
        p = self.proxy
        try:
            self.sr, self.sw = await asyncio.open_connection(p.upstream_host, p.upstream_port)
        except OSError:
            p.stats.upstream_failures += 1
            self.close(reset=True)
            return
        tasks = [asyncio.create_task(self._upstream()), asyncio.create_task(self._downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.close()

    async def _upstream(self) -> None:
        """client → server: parse commands (RESP mode), note which reply to lose, forward."""
        parser = RespParser(requests=True) if self.proxy.resp else None
        assert self.sw is not None
        while data := await self.cr.read(65536):
            if parser is not None:
                try:
                    frames = parser.feed(data)
                except RespProtocolError as err:
                    log.warning("fault proxy: client sent non-RESP bytes (%s); cutting", err)
                    return
                for f in frames:
                    self._note_command(f)
            self.sw.write(data)
            await self.sw.drain()

    def _note_command(self, frame: Frame) -> None:
        cmd: list[bytes] = frame.value
        p = self.proxy
        p.stats.commands += 1
        name = command_name(cmd)
        doom = None
        for rule in p.rules:
            if rule.fired.is_set() or not rule.predicate(cmd):
                continue
            rule.matches += 1
            if rule.matches == rule.nth:
                rule.lost_command = cmd
                doom = rule
                break
        if name == "MULTI":
            self.in_multi = True
            self.pending.append(_Pending(cmd))
        elif name in ("EXEC", "DISCARD") and self.in_multi:
            self.in_multi = False
            at_exec = self.multi_doom if name == "EXEC" else None
            self.multi_doom = None
            self.pending.append(_Pending(cmd, at_exec))
        elif self.in_multi and doom is not None:
            self.multi_doom = doom  # queued now, executed (and its effect answered) at EXEC
            self.pending.append(_Pending(cmd))
        else:
            self.pending.append(_Pending(cmd, doom))

    async def _downstream(self) -> None:
        """server → client: pair each reply with its command; lose the doomed one."""
        assert self.sr is not None
        parser = RespParser(requests=False) if self.proxy.resp else None
        while data := await self.sr.read(65536):
            if parser is None:
                self.cw.write(data)
                await self.cw.drain()
                continue
            try:
                frames = parser.feed(data)
            except RespProtocolError as err:
                log.warning("fault proxy: server sent non-RESP bytes (%s); cutting", err)
                return
            out = bytearray()
            for f in frames:
                if f.push:
                    out += f.raw
                    continue
                self.proxy.stats.replies += 1
                pend = self.pending.popleft() if self.pending else None
                if pend is not None and pend.rule is not None:
                    if out:
                        self.cw.write(bytes(out))
                        await self.cw.drain()
                    pend.rule.fired.set()
                    self.proxy.stats.lost_replies += 1
                    log.info("fault proxy: lost the reply to %s", command_name(pend.cmd))
                    self.close(reset=True)
                    return
                out += f.raw
            if out:
                self.cw.write(bytes(out))
                await self.cw.drain()

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for w in (self.cw, self.sw):
            if w is None:
                continue
            if reset:
                _set_linger_zero(w)
            w.transport.abort()
        self.proxy.conns.discard(self)


def _set_linger_zero(writer: asyncio.StreamWriter) -> None:
    """Make the close an RST, as from a dead peer, not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class FaultProxy:
    """Listens on `listen_host:listen_port` (0: a free port) and forwards to the upstream."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        resp: bool = True,
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.resp = resp
        self.rules: list[LostReplyRule] = []
        self.conns: set[_Conn] = set()
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._reopen: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(
            self._accept, self.listen_host, self.listen_port, reuse_address=True
        )
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        conn = _Conn(self, cr, cw)
        self.conns.add(conn)
        self.stats.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await conn.run()
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def cut_all(self) -> int:
        """Reset every open connection; returns how many."""
        conns = list(self.conns)
        for c in conns:
            c.close(reset=True)
        self.stats.cuts += len(conns)
        return len(conns)

    async def refuse_for(self, seconds: float) -> None:
        """Cut everything and refuse connections for `seconds`, then listen again (returns at once)."""
        await self._close_listener()
        if self._reopen is not None:
            self._reopen.cancel()
        self._reopen = asyncio.create_task(self._reopen_after(seconds))

    async def _reopen_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.start()

    async def _close_listener(self) -> None:
        """Stop accepting, reset every connection (newer Pythons' wait_closed waits for them)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self.cut_all()
        if server is not None:
            await server.wait_closed()

    def lose_reply(self, predicate: Predicate, nth: int = 1) -> LostReplyRule:
        if nth < 1:
            raise ValueError(f"nth must be >= 1, got {nth}")
        rule = LostReplyRule(predicate, nth)
        self.rules.append(rule)
        return rule

    def disarm(self, rule: LostReplyRule) -> bool:
        """Withdraw a `lose_reply` rule that has not fired; False if it already fired."""
        if rule in self.rules:
            self.rules.remove(rule)
        return not rule.fired.is_set()

    async def stop(self) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
        await self._close_listener()  # resets every connection: their tasks end by themselves
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)


class ProxyThread:
    """A `FaultProxy` on its own event loop in a daemon thread, driven synchronously."""

    def __init__(self, upstream_host: str, upstream_port: int, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self.proxy = FaultProxy(upstream_host, upstream_port, **kwargs)
        self._call(self.proxy.start())

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def port(self) -> int:
        return self.proxy.listen_port

    @property
    def address(self) -> str:
        return self.proxy.address

    @property
    def stats(self) -> ProxyStats:
        return self.proxy.stats

    def cut_all(self) -> int:
        return self._call(self.proxy.cut_all())

    def refuse_for(self, seconds: float) -> None:
        self._call(self.proxy.refuse_for(seconds))

    def lose_reply(self, predicate: Predicate, nth: int = 1) -> LostReplyRule:
        async def arm() -> LostReplyRule:  # on the proxy's loop: no race with a connection's pump
            return self.proxy.lose_reply(predicate, nth)

        return self._call(arm())

    def disarm(self, rule: LostReplyRule) -> bool:
        async def disarm() -> bool:
            return self.proxy.disarm(rule)

        return self._call(disarm())

    def stop(self) -> None:
        if not self._loop.is_running():
            return
        with contextlib.suppress(Exception):
            self._call(self.proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> ProxyThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
