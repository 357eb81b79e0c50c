"""The server side of `GenerateStream`: many Generate requests over one bidirectional stream.

Each request runs as its own task through the same function as unary Generate; finished requests
are sent in completion order, and everything that finished while the previous message was being
written goes out in one message, so a busy stream costs one write per batch, not per request.

`abort_ids` in a message abort requests of this stream. Tasks start in the order they were
created (asyncio runs ready callbacks first in, first out), and a request registers with the engine
before its first suspension, so an abort runs after every request read before it has reached the
engine: an abort never misses a request sent earlier on the stream. Aborts run one at a time and
are answered (`aborts`) in the order they came.

Invariants:
- every request read is answered exactly once (a response or an error) unless the stream is
  cancelled; cancelling the stream (client gone, server stopping) cancels the requests still
  running, which aborts them on the engine;
- every message with `abort_ids` is answered by exactly one `AbortResponse`, in order, unless the
  stream is cancelled;
- the stream ends only after the client closed its side and every request has been answered;
- ending the stream never waits long on its requests: they are cancelled and given
  `CANCEL_WAIT_S` to finish, so a request stuck in its engine cannot hold up the server's shutdown
  (grpc's `stop()` waits for every handler).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from asyncdapo.contracts.v1 import gateway_pb2

RunOne = Callable[[gateway_pb2.GenerateRequest], Awaitable[gateway_pb2.GenerateResponse]]
ToError = Callable[[str, Exception], gateway_pb2.GenerateError]
AbortIds = Callable[[list[str]], Awaitable[list[str]]]  # ids to abort -> ids that were aborted

CANCEL_WAIT_S = 5.0
log = logging.getLogger(__name__)


async def serve_stream(
    requests: AsyncIterator[gateway_pb2.GenerateStreamRequest],
    run_one: RunOne,
    to_error: ToError,
    abort: AbortIds,
) -> AsyncIterator[gateway_pb2.GenerateStreamResponse]:
    finished: list[gateway_pb2.GenerateResponse | gateway_pb2.GenerateError] = []
    acks: list[list[str]] = []
    running: set[asyncio.Task[None]] = set()
    # this stream's requests not answered yet, by id (the first of a duplicate id: its copy is rejected)
    mine: dict[str, asyncio.Task[None]] = {}
    abort_turn = asyncio.Lock()  # fair (FIFO): aborts finish, and are answered, in arrival order
    wake = asyncio.Event()

    def done() -> None:
        # leave `running` before waking the writer, so it can tell when the stream is done
        running.discard(asyncio.current_task())
        wake.set()

    async def one(req: gateway_pb2.GenerateRequest) -> None:
        try:
            finished.append(await run_one(req))
        except Exception as err:  # the request's own failure, reported on it; the stream goes on
            finished.append(to_error(req.request_id, err))
        if mine.get(req.request_id) is asyncio.current_task():
            del mine[req.request_id]
        done()

    async def abort_some(ids: list[str]) -> None:
        async with abort_turn:
            acks.append(await abort([i for i in dict.fromkeys(ids) if i in mine]))
        done()

    async def read() -> None:
        try:
            async for msg in requests:
                for req in msg.requests:
                    t = asyncio.create_task(one(req))
                    running.add(t)
                    mine.setdefault(req.request_id, t)
                if msg.abort_ids:
                    running.add(asyncio.create_task(abort_some(list(msg.abort_ids))))
        finally:
            wake.set()

    reader = asyncio.create_task(read())
    try:
        while True:
            await wake.wait()
            wake.clear()
            if finished or acks:
                batch = finished[:]
                finished.clear()
                out = gateway_pb2.GenerateStreamResponse()
                for item in batch:
                    if isinstance(item, gateway_pb2.GenerateError):
                        out.errors.append(item)
                    else:
                        out.responses.append(item)
                for ids in acks:
                    out.aborts.add(aborted_ids=ids)
                acks.clear()
                yield out
            if reader.done() and not running and not finished and not acks:
                break
        reader.result()  # a broken request side ends the stream with its error
    finally:
        left = {reader, *running}
        for t in left:
            t.cancel()
        _, stuck = await asyncio.wait(left, timeout=CANCEL_WAIT_S)
        if stuck:
            log.error("generate stream closed with %d task(s) still not finished after cancel", len(stuck))
