"""What claiming prompts answers: the claims, the claim a prompt is held by, and the refusal of a
fenced scheduler. Pure records, apart from `queue` (Redis, Lua) because the rollout core admits
claims without I/O and the in-memory queue (`memstore`) makes the same ones."""

from __future__ import annotations

from dataclasses import dataclass


class Fenced(RuntimeError):
    """Another scheduler took this run over (a higher fencing epoch): this one must stop."""


@dataclass(frozen=True, slots=True)
class Claim:
    pid: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    owner: str
    attempt: int
    unix_ms: int


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    claims: list[Claim]
    admitted_total: int  # `counters.admitted` after this claim (a rollback shows as a drop)
