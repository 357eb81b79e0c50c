"""Trainer fencing: one writing trainer per run, even when two processes overlap.

Redis holds (see `RunKeys`):
- `trainer:lease`  STRING trainer id, PX lease (default 30 s), renewed every lease/3 by a heartbeat
  thread and by every `check()`;
- `trainer:epoch`  INT, INCRed each time a trainer acquires the lease;
- `trainer:owner`  STRING the id that took the current epoch.

A starting trainer acquires the lease before it reads its checkpoint or touches the stream; while
another live trainer holds it, it waits (and logs who). The same id acquires at once (a restart of
the same container). Before every ledger line, checkpoint and publish the trainer `check()`s, in
one round trip, that the lease is its own and the epoch unchanged; every script that writes the
stream (read, drop, XACK, trim) checks the same inside Redis, atomically with its writes. A
mismatch raises `TrainerFenced`: the process stops and writes nothing more. PublishWeights carries
the epoch so the scheduler refuses a replaced trainer too.

After a Redis outage longer than the lease the key has expired; the trainer that owns the current
epoch re-takes it without a new epoch, unless another trainer acquired it first (its epoch is
newer, so the old one is fenced). A Redis rollback that loses the acquisition itself fences the
trainer (fail-safe: it exits; its restart acquires again and resumes from its checkpoint).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from typing import Any

from asyncdapo.contracts.errors import AsyncdapoError
from asyncdapo.contracts.redis_keys import RunKeys, text
from asyncdapo.contracts.redis_scripts import LuaPrelude, RedisScript, prelude, script
from asyncdapo.runtime.redis_conn import is_unavailable
from asyncdapo.runtime.redis_outage import RedisWaiter
from asyncdapo.services.trainer.redis_io import TRAINER_REDIS_BACKOFF

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 30.0

# The lease scripts (asyncdapo/contracts/redis_scripts/trainer_lease_*.lua: KEYS, ARGV, replies).
_ACQUIRE = script(RedisScript.TRAINER_LEASE_ACQUIRE)
_RENEW = script(RedisScript.TRAINER_LEASE_RENEW)
_RELEASE = script(RedisScript.TRAINER_LEASE_RELEASE)

# Prefix of every script that writes on the trainer's behalf (trainer_fence_check.lua). KEYS[1],
# KEYS[2]: lease, epoch; ARGV[1], ARGV[2]: id, epoch ('' id: unfenced, for tools and tests).
# Returns {'FENCED'}. The groups_reader scripts start with it (the loader prepends it: `PRELUDES`).
FENCE_LUA = prelude(LuaPrelude.TRAINER_FENCE_CHECK)


class TrainerFenced(AsyncdapoError, RuntimeError):
    """Another trainer holds the run: this one must stop and write nothing more."""


def default_trainer_id() -> str:
    """host-pid-random: unique per process (a replacement pod waits for the old one's lease)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def safe_id(trainer_id: str) -> str:
    """The id as a file-name component (tmp directories are named after their writer)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", trainer_id) or "trainer"


class TrainerFence:
    def __init__(
        self,
        client: Any,
        keys: RunKeys,
        trainer_id: str,
        waiter: RedisWaiter | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        if not trainer_id:
            raise ValueError("trainer_id must not be empty")
        self.client = client
        self.keys = keys
        self.trainer_id = trainer_id
        self.waiter = waiter or RedisWaiter(TRAINER_REDIS_BACKOFF)
        self.lease_ms = int(lease_s * 1000)
        self.epoch = 0
        self.lost: str | None = None  # set by the heartbeat when it finds the lease taken
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lease_keys(self) -> list[str]:
        return [self.keys.trainer_lease, self.keys.trainer_epoch, self.keys.trainer_owner]

    def script_args(self) -> list[str]:
        """ARGV[1], ARGV[2] of a script starting with FENCE_LUA."""
        return [self.trainer_id, str(self.epoch)]

    # ------------------------------------------------------------------ acquisition

    def acquire(self, poll_s: float = 1.0, timeout_s: float | None = None) -> int:
        """Wait until no other live trainer holds the lease, take it; returns the new epoch."""
        started = time.monotonic()
        last_holder: str | None = None
        last_log = 0.0
        while True:
            reply = self.waiter.call(
                lambda _a: self._acquire(keys=self.lease_keys, args=[self.trainer_id, self.lease_ms]),
                "trainer lease acquisition",
            )
            if int(reply[0]) == 1:
                self.epoch = int(reply[1])
                waited = time.monotonic() - started
                log.info(
                    "trainer %s holds the lease of run %s at epoch %d%s", self.trainer_id, self.keys.run,
                    self.epoch, f" (waited {waited:.1f}s)" if last_holder else "",
                )  # fmt: skip
                return self.epoch
            holder, pttl = text(reply[1]), int(reply[2])
            now = time.monotonic()
            if holder != last_holder or now - last_log > 60:
                log.warning(
                    "trainer lease of run %s is held by %s (expires in %.1fs unless it renews it); "
                    "trainer %s waits for it", self.keys.run, holder, max(pttl, 0) / 1000, self.trainer_id,
                )  # fmt: skip
                last_holder, last_log = holder, now
            if timeout_s is not None and now - started > timeout_s:
                raise TimeoutError(f"trainer lease of run {self.keys.run} still held by {holder}")
            time.sleep(min(poll_s, max(pttl, 50) / 1000))

    # ------------------------------------------------------------------ checks

    def _fenced(self, holder: Any, epoch: Any) -> TrainerFenced:
        if not text(holder) and not text(epoch):
            return TrainerFenced(
                f"trainer {self.trainer_id} (epoch {self.epoch}) lost its fence of run {self.keys.run}: Redis "
                "no longer has the run's trainer epoch (its data was lost or flushed). This trainer stops "
                "without writing; a restart takes the lease anew and resumes from its checkpoint"
            )
        return TrainerFenced(
            f"trainer {self.trainer_id} (epoch {self.epoch}) was fenced out of run {self.keys.run}: "
            f"the lease is held by {text(holder) or 'nobody'!r} at epoch {text(epoch) or '?'}. Another "
            "trainer took over the run, so this one stops without writing a checkpoint, a ledger line "
            "or a weight version"
        )

    def _renew_once(self) -> list[Any]:
        return list(self._renew(keys=self.lease_keys, args=[self.trainer_id, self.epoch, self.lease_ms]))

    def check(self) -> None:
        """One round trip: the lease is ours (renewed) and the epoch unchanged, else TrainerFenced."""
        reply = self.waiter.call(lambda _a: self._renew_once(), "trainer fence check")
        code = int(reply[0])
        if code == 2:
            log.warning(
                "trainer %s re-took its expired lease (epoch %d unchanged)", self.trainer_id, self.epoch
            )
        if code == 0:
            raise self._fenced(reply[1], reply[2])

    def fenced_reply(self, reply: Any) -> bool:
        """True if a FENCE_LUA script answered {'FENCED'}."""
        return isinstance(reply, list) and len(reply) == 1 and text(reply[0]) == "FENCED"

    def run_fenced(self, call: Any) -> Any:
        """`call()` runs a FENCE_LUA script; on FENCED, `check()` (which re-takes an expired
        lease of ours or raises TrainerFenced) and run it once more."""
        reply = call()
        if self.fenced_reply(reply):
            self.check()
            reply = call()
            if self.fenced_reply(reply):
                raise self._fenced("?", "?")
        return reply

    # ------------------------------------------------------------------ heartbeat and release

    def start_heartbeat(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="trainer-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        interval = self.lease_ms / 3000
        while not self._stop.wait(interval):
            try:
                reply = self._renew_once()
            except Exception as err:
                if is_unavailable(err):
                    self.waiter.note_failure(err, "trainer lease heartbeat")
                    continue
                log.exception("trainer lease heartbeat failed")
                continue
            self.waiter.note_success()
            code = int(reply[0])
            if code == 2:
                log.warning("trainer %s re-took its expired lease (epoch %d)", self.trainer_id, self.epoch)
            elif code == 0:
                self.lost = str(self._fenced(reply[1], reply[2]))
                log.error("%s", self.lost)
                return

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def release(self) -> None:
        """Give the lease up (graceful end) so a successor need not wait for it to expire."""
        self.stop_heartbeat()
        if not self.epoch:
            return
        try:
            released = self._release(keys=self.lease_keys[:2], args=[self.trainer_id, self.epoch])
        except Exception as err:  # the lease then simply expires
            log.warning("could not release the trainer lease (%s); it expires by itself", err)
            return
        if released:
            log.info("trainer %s released the lease of run %s", self.trainer_id, self.keys.run)
