"""When each policy version's rollout started and ended, read from the run's Redis — no service
has to report it, and the trainer's own timers do not matter.

- Start of version v: the scheduler writes the run's `weights` hash {version, uri} right after the
  weight fan-out (pause → reload → resume on every gateway) and raises the valid-group bound in the
  same breath, so admission for v starts then. `WeightsWatcher` gets a keyspace notification for
  that write and records the wall time it arrived (no polling interval blurs it).
- End of version v: the B-th valid group of v is the ((v + 1)·B)-th entry of the `groups` stream
  (the bound admits exactly B per version, in commit order); its entry id carries the Redis
  server's wall time in ms. `GroupsWatcher` reads the ids as they arrive (the trainer trims the
  stream behind it).

Both clocks are this host's wall clock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from asyncdapo.contracts.redis_keys import RunKeys
from asyncdapo.runtime.redis_conn import sync_client


class WeightsWatcher:
    """Wall time at which each policy version was announced on `RunKeys.weights`."""

    def __init__(self, redis_url: str, run: str) -> None:
        self.keys = RunKeys(run)
        self.r = sync_client(redis_url)
        self.announced: dict[int, float] = {}
        self._pubsub: Any = None
        self._thread: Any = None
        self._lock = threading.Lock()

    def start(self) -> WeightsWatcher:
        # K: keyspace channel, h: hash commands. The Redis is the benchmark's own (LocalStack's).
        self.r.config_set("notify-keyspace-events", "Kh")
        self._pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(**{f"__keyspace@0__:{self.keys.weights}": self._on_event})
        self._thread = self._pubsub.run_in_thread(sleep_time=0.05, daemon=True)
        return self

    def _on_event(self, _message: dict[str, Any]) -> None:
        t = time.time()
        version = int(self.r.hget(self.keys.weights, "version") or 0)
        with self._lock:
            self.announced.setdefault(version, t)

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread.join(timeout=5)
        if self._pubsub is not None:
            self._pubsub.close()
        self.r.close()


class GroupsWatcher:
    """Commit time (its entry id's ms) of every entry of the run's `groups` stream, read as they
    arrive: the trainer trims the stream behind its reads (groups_reader.py: XTRIM MINID), so after
    the run it is empty."""

    def __init__(self, redis_url: str, run: str) -> None:
        self.key = RunKeys(run).groups
        self.r = sync_client(redis_url)
        self.times: list[float] = []
        # per entry: prompt id, prompt tokens, response lengths, acc (1 right / 0 wrong), finish
        # reasons, min version (the SIMULATOR's bench fits its workload's length structure on these)
        self.groups: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> GroupsWatcher:
        self._thread.start()
        return self

    def _loop(self) -> None:
        last = "0-0"
        while not self._stop.is_set():
            for _stream, entries in self.r.xread({self.key: last}, block=100, count=1000) or []:
                for eid, fields in entries:
                    last = eid.decode() if isinstance(eid, bytes) else eid
                    self.times.append(int(last.split("-")[0]) / 1000.0)
                    self.groups.append(_summary(fields))

    def ends(self, batch: int) -> list[float]:
        """Wall time of the B-th committed group of each complete version, index = version."""
        ids = list(self.times)
        return [ids[(v + 1) * batch - 1] for v in range(len(ids) // batch)]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.r.close()


def _summary(fields: dict[Any, Any]) -> dict[str, Any]:
    from asyncdapo.contracts.v1 import rollout_pb2

    g = rollout_pb2.Group()
    raw = fields.get(b"g", fields.get("g", b""))
    g.ParseFromString(raw if isinstance(raw, bytes) else raw.encode("latin-1"))
    rs = g.responses
    return {
        "pid": g.prompt_id,
        "prompt": len(g.prompt_token_ids),
        "lengths": [len(r.token_ids) for r in rs],
        "acc": [r.acc for r in rs],
        "finish": [int(r.finish_reason) for r in rs],
        "min_version": g.min_version,
    }


def generation_times(announced: dict[int, float], ends: list[float]) -> dict[int, float]:
    """Seconds from the announcement of version v to its B-th valid group (versions >= 1: version
    0 starts when the trainer first fills the queue, not at an announcement)."""
    return {v: ends[v] - announced[v] for v in range(1, len(ends)) if v in announced}
