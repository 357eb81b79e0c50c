"""When each policy version's rollout started and ended, read from the run's Redis — no service
has to report it, and the trainer's own timers do not matter.

- Start of version v: the scheduler writes the run's `weights` hash {version, uri} right after the
  weight fan-out (pause → reload → resume on every gateway) and raises the valid-group bound in the
  same breath, so admission for v starts then. `WeightsWatcher` gets a keyspace notification for
  that write and records the wall time it arrived (no polling interval blurs it).
- End of version v: the B-th valid group of v is the ((v + 1)·B)-th entry of the `groups` stream
  (the bound admits exactly B per version, in commit order); its entry id carries the Redis
  server's wall time in ms.

Both clocks are this host's wall clock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from asyncdapo.redis_conn import sync_client
from asyncdapo.redis_keys import RunKeys


class WeightsWatcher:
    """Wall time at which each policy version was announced on `RunKeys.weights`."""

    def __init__(self, redis_url: str, run: str) -> None:
        self.keys = RunKeys(run)
        self.r = sync_client(redis_url)
        self.announced: dict[int, float] = {}
        # wall time of each XADD to the groups stream, in commit order: read live because the
        # trainer trims the stream after each durable checkpoint (groups_reader.py)
        self.committed: list[float] = []
        self._pubsub: Any = None
        self._thread: Any = None
        self._lock = threading.Lock()

    def start(self) -> WeightsWatcher:
        # K: keyspace channel, h: hash commands, t: stream commands. The Redis is the benchmark's
        # own (LocalStack's).
        self.r.config_set("notify-keyspace-events", "Kht")
        self._pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(
            **{
                f"__keyspace@0__:{self.keys.weights}": self._on_event,
                f"__keyspace@0__:{self.keys.groups}": self._on_groups,
            }
        )
        self._thread = self._pubsub.run_in_thread(sleep_time=0.05, daemon=True)
        return self

    def _on_event(self, _message: dict[str, Any]) -> None:
        t = time.time()
        version = int(self.r.hget(self.keys.weights, "version") or 0)
        with self._lock:
            self.announced.setdefault(version, t)

    def _on_groups(self, message: dict[str, Any]) -> None:
        if message.get("data") in (b"xadd", "xadd"):
            t = time.time()
            with self._lock:
                self.committed.append(t)

    def version_ends(self, batch: int) -> list[float]:
        """Wall time of the B-th committed group of each complete version, index = version (as
        `version_ends` below, from the live notifications: the stream itself is trimmed)."""
        with self._lock:
            ids = list(self.committed)
        return [ids[(v + 1) * batch - 1] for v in range(len(ids) // batch)]

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread.join(timeout=5)
        if self._pubsub is not None:
            self._pubsub.close()
        self.r.close()


def version_ends(redis_url: str, run: str, batch: int) -> list[float]:
    """Wall time of the B-th committed group of each complete version, index = version."""
    r = sync_client(redis_url)
    try:
        ids = [int(eid.split(b"-")[0]) / 1000.0 for eid, _ in r.xrange(RunKeys(run).groups)]
    finally:
        r.close()
    return [ids[(v + 1) * batch - 1] for v in range(len(ids) // batch)]


def generation_times(announced: dict[int, float], ends: list[float]) -> dict[int, float]:
    """Seconds from the announcement of version v to its B-th valid group (versions >= 1: version
    0 starts when the trainer first fills the queue, not at an announcement)."""
    return {v: ends[v] - announced[v] for v in range(1, len(ends)) if v in announced}
