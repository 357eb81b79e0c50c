"""What the gRPC fuzz tests share: the event loop the servers under test run on, and the check
that a refusal's status names the caller's mistake or the service's state."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc

# a status that says nothing about the request (a crash, an unhandled case) or no answer in time
REFUSED = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}


class LoopThread:
    """An event loop on a daemon thread, where the servers under test run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-servers", daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def check_status(err: grpc.RpcError, what: object, details_fit: bool = False) -> None:
    """`details_fit`: also refuse the answer gRPC replaced because its details were too large for
    the metadata (an echo of a huge input): RESOURCE_EXHAUSTED "received metadata size exceeds"."""
    code, details = err.code(), err.details() or ""  # type: ignore[attr-defined]
    assert code not in REFUSED, f"{code.name}: {details!r:.300} for {what!r:.300}"
    if details_fit:
        assert "metadata size exceeds" not in details, f"answer lost: {details!r:.300} for {what!r:.300}"
