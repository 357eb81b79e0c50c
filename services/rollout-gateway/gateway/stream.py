"""The server side of `GenerateStream`: many Generate requests over one bidirectional stream.

Each request runs as its own task through the same function as unary Generate; finished requests
are sent in completion order, and everything that finished while the previous message was being
written goes out in one message, so a busy stream costs one write per batch, not per request.

Invariants:
- every request read is answered exactly once (a response or an error) unless the stream is
  cancelled; cancelling the stream (client gone, server stopping) cancels the requests still
  running, which aborts them on the engine;
- the stream ends only after the client closed its side and every request has been answered;
- ending the stream never waits long on its requests: they are cancelled and given
  `CANCEL_WAIT_S` to finish, so a request stuck in its engine cannot hold up the server's shutdown
  (grpc's `stop()` waits for every handler).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from asyncdapo.v1 import gateway_pb2

RunOne = Callable[[gateway_pb2.GenerateRequest], Awaitable[gateway_pb2.GenerateResponse]]
ToError = Callable[[str, Exception], gateway_pb2.GenerateError]

CANCEL_WAIT_S = 5.0
log = logging.getLogger(__name__)


async def serve_stream(
    requests: AsyncIterator[gateway_pb2.GenerateStreamRequest], run_one: RunOne, to_error: ToError
) -> AsyncIterator[gateway_pb2.GenerateStreamResponse]:
    finished: list[gateway_pb2.GenerateResponse | gateway_pb2.GenerateError] = []
    running: set[asyncio.Task[None]] = set()
    wake = asyncio.Event()

    async def one(req: gateway_pb2.GenerateRequest) -> None:
        try:
            finished.append(await run_one(req))
        except Exception as err:  # the request's own failure, reported on it; the stream goes on
            finished.append(to_error(req.request_id, err))
        # leave `running` before waking the writer, so it can tell when the stream is done
        running.discard(asyncio.current_task())  # type: ignore[arg-type]
        wake.set()

    async def read() -> None:
        try:
            async for msg in requests:
                for req in msg.requests:
                    t = asyncio.create_task(one(req))
                    running.add(t)
        finally:
            wake.set()

    reader = asyncio.create_task(read())
    try:
        while True:
            await wake.wait()
            wake.clear()
            if finished:
                batch = finished[:]
                finished.clear()
                out = gateway_pb2.GenerateStreamResponse()
                for item in batch:
                    if isinstance(item, gateway_pb2.GenerateError):
                        out.errors.append(item)
                    else:
                        out.responses.append(item)
                yield out
            if reader.done() and not running and not finished:
                break
        reader.result()  # a broken request side ends the stream with its error
    finally:
        left = {reader, *running}
        for t in left:
            t.cancel()
        _, stuck = await asyncio.wait(left, timeout=CANCEL_WAIT_S)
        if stuck:
            log.error("generate stream closed with %d task(s) still not finished after cancel", len(stuck))
