"""One atomic read of a run's control state in Redis, for the invariant checker.

Prompt state, claims, counters, the queue, the scheduler's lease, the groups stream's entries-added
and the published version are read by one Lua script: a consistent snapshot, so a FINISH or a
CLAIM landing between two reads can never look like a violation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncdapo.contracts.redis_keys import RunKeys, text
from asyncdapo.contracts.redis_scripts import RedisScript, script

# One atomic read of the run's control state (asyncdapo/contracts/redis_scripts/faults_snapshot.lua).
_SNAPSHOT = script(RedisScript.FAULTS_SNAPSHOT)

_s = text


def _pairs(flat: list[Any]) -> dict[str, str]:
    return {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}


def _sid(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


@dataclass
class Snapshot:
    now_ms: int
    prompts: dict[str, dict[str, str]]  # pid -> prompt state
    claimed: dict[str, str]
    counters: dict[str, int]
    queue: list[str]
    live_owners: set[str]
    entries_added: int
    published_version: int | None


def read_snapshot(r: Any, keys: RunKeys) -> Snapshot:
    """The snapshot of run `keys`; the live owner is the one named by the run's lease key
    (`scheduler:lease` = `owner|epoch`, see asyncdapo.services.scheduler.queue), if it has not expired."""
    p = keys.prefix
    raw = r.eval(_SNAPSHOT, 0, p, _glob_escape(p))
    t, flat_prompts, claimed, counters, queue, lease, added, version = raw
    prompts = {}
    plen = len(p + "prompt:")
    for i in range(0, len(flat_prompts), 2):
        prompts[_s(flat_prompts[i])[plen:]] = _pairs(flat_prompts[i + 1])
    holder = _s(lease).split("|")[0] if _s(lease) else ""
    return Snapshot(
        now_ms=int(t[0]) * 1000 + int(t[1]) // 1000,
        prompts=prompts,
        claimed=_pairs(claimed),
        counters={k: int(float(v)) for k, v in _pairs(counters).items()},
        queue=[_s(x) for x in queue],
        live_owners={holder} if holder else set(),
        entries_added=int(added),
        published_version=int(_s(version)) if _s(version) else None,
    )
