"""One long-lived `GenerateStream` to one gateway: the transport under the dispatcher.

Requests placed while the writer is busy (or within one dispatcher pump, which never yields) are
sent together in one message; each response message is handed whole to `on_message`, so the
dispatcher pumps once per message, not once per response. Aborts travel in the stream too
(`abort`), behind the requests they abort, so the gateway cannot miss a request still in transit;
each is answered in order with the ids that were aborted. The stream knows nothing about tasks,
retries or the pool: any failure of the stream is reported once through `on_broken`, and the
dispatcher decides what to re-dispatch.

Invariants:
- after `close()` or `on_broken`, the stream is dead: nothing more is written, read or reported,
  and every abort still waiting for its answer gets an empty one;
- `on_broken` is called at most once, and never after `close()`;
- the reader and writer never end silently: any failure, a bug included, breaks the stream, so
  its requests are re-dispatched instead of waiting forever for an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from asyncdapo.contracts.v1 import gateway_pb2

if TYPE_CHECKING:
    from asyncdapo.services.scheduler.gateway_pool import Gateway
    from asyncdapo.services.scheduler.tasks import Request

log = logging.getLogger(__name__)

_Abort = tuple[asyncio.Future[list[str]], set[str]]  # an abort's answer, and the ids it asked for


class GatewayStream:
    def __init__(
        self,
        gw: Gateway,
        on_message: Callable[[GatewayStream, gateway_pb2.GenerateStreamResponse], None],
        on_broken: Callable[[GatewayStream, str, str], None],
        on_sent: Callable[[list[Request]], None],
    ) -> None:
        self.gw = gw
        self.dead = False
        self._on_message = on_message
        self._on_broken = on_broken
        self._on_sent = on_sent
        self._outbox = gateway_pb2.GenerateStreamRequest()
        self._outbox_reqs: list[Request] = []
        # aborts of the next write, and those of the writes sent and not answered yet (one answer
        # per message, shared out to the aborts the message carried)
        self._outbox_aborts: list[_Abort] = []
        self._acks: deque[list[_Abort]] = deque()
        self._wake = asyncio.Event()
        self.call = gw.stub.GenerateStream()
        self._writer = asyncio.create_task(self._write_loop())
        self._reader = asyncio.create_task(self._read_loop())

    def add(self, req: Request) -> gateway_pb2.GenerateRequest:
        """A new request message in the next write, to be filled in by the caller (no copy)."""
        self._outbox_reqs.append(req)
        self._wake.set()
        return self._outbox.requests.add()

    def abort(self, rids: list[str]) -> asyncio.Future[list[str]]:
        """Abort requests of this stream (in the next write, after the requests queued before);
        the future gets the ids the gateway aborted (empty if the stream dies first)."""
        fut: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        if self.dead:
            fut.set_result([])
            return fut
        self._outbox.abort_ids.extend(rids)
        self._outbox_aborts.append((fut, set(rids)))
        self._wake.set()
        return fut

    def _answer_aborts(self, msg: gateway_pb2.GenerateStreamResponse) -> None:
        for ack in msg.aborts:
            if not self._acks:
                raise RuntimeError("the gateway answered an abort that was never sent")
            for fut, rids in self._acks.popleft():
                if not fut.done():
                    fut.set_result([rid for rid in ack.aborted_ids if rid in rids])

    def close(self) -> None:
        """Cancel the stream: the gateway aborts whatever is still running on it."""
        if self.dead:
            return
        self.dead = True
        self.call.cancel()
        for fut, _ in [*self._outbox_aborts, *(a for group in self._acks for a in group)]:
            if not fut.done():
                fut.set_result([])
        self._outbox_aborts, self._acks = [], deque()
        me = asyncio.current_task()
        for t in (self._writer, self._reader):
            if t is not me:
                t.cancel()

    def _broken(self, code: str, details: str) -> None:
        if self.dead:
            return
        self.close()
        self._on_broken(self, code, details)

    def _own_cancel(self) -> bool:
        """Whether a CancelledError is ours (`close`). grpc also raises it from a call cancelled
        by someone else (its channel closed): that breaks the stream instead."""
        task = asyncio.current_task()
        return self.dead or (task is not None and task.cancelling() > 0)

    async def _write_loop(self) -> None:
        try:
            while not self.dead:
                await self._wake.wait()
                self._wake.clear()
                if not self._outbox_reqs and not self._outbox.abort_ids:
                    continue
                msg, reqs = self._outbox, self._outbox_reqs
                self._outbox, self._outbox_reqs = gateway_pb2.GenerateStreamRequest(), []
                if reqs:
                    self._on_sent(reqs)
                if self._outbox_aborts:
                    self._acks.append(self._outbox_aborts)
                    self._outbox_aborts = []
                await self.call.write(msg)
        except grpc.aio.AioRpcError as err:
            self._broken(err.code().name, err.details() or "")
        except asyncio.InvalidStateError:  # the call already ended: the reader reports why
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1.0)
            self._broken("UNAVAILABLE", "generate stream ended while writing")
        except asyncio.CancelledError:
            if self._own_cancel():
                raise
            self._broken("CANCELLED", "generate stream cancelled (channel closed)")
        except Exception as err:
            log.exception("generate stream writer to %s failed", self.gw.address)
            self._broken("INTERNAL", f"stream writer failed: {err!r}")

    async def _read_loop(self) -> None:
        try:
            while not self.dead:
                msg = await self.call.read()
                if msg is grpc.aio.EOF:
                    self._broken("UNAVAILABLE", "generate stream ended by the gateway")
                    return
                if msg.aborts:
                    self._answer_aborts(msg)
                self._on_message(self, msg)
        except grpc.aio.AioRpcError as err:
            self._broken(err.code().name, err.details() or "")
        except asyncio.CancelledError:
            if self._own_cancel():
                raise
            self._broken("CANCELLED", "generate stream cancelled (channel closed)")
        except Exception as err:  # a bug handling a message: its requests go elsewhere, loudly
            log.exception("generate stream reader from %s failed", self.gw.address)
            self._broken("INTERNAL", f"stream reader failed: {err!r}")
