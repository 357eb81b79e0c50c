"""The seeded fault schedule of the chaos soak (`make chaos`): which fault, on what, for how long.

Pure: `plan(seed, count, gateways)` is a function of its arguments, so a seed names a run and a
violation found under it can be replayed fault for fault (timing on a loaded machine varies, the
sequence does not).

Fault kinds (`FaultKind`), each hitting one real process or one real connection:
- `<svc>:kill` / `<svc>:term`: SIGKILL of the service's process group, or SIGTERM to its main
  process (SIGKILL of the group after a 30 s grace), then started again at once on the same port,
  as a Deployment/StatefulSet/Job would; `<svc>` is the scheduler, a gateway, the verifier or the
  trainer;
- `redis:kill` / `redis:term`: the same for redis-server, kept down `duration_s` (0-3 s), restarted
  from its AOF (`appendfsync always`);
- `gateway:stop`: a gateway SIGSTOPped for `duration_s` (longer than the 3 s staleness of its load
  reports, so the scheduler sees it down), then SIGCONTed;
- `redis-conn:cut` / `gateway-conn:cut`: every connection of one service to Redis (the scheduler's
  or the trainer's), or of the scheduler to one gateway, reset by the TCP fault proxy; with
  `duration_s` > 0 the proxy also refuses new connections that long;
- `redis:lost-reply`: Redis executes the `nth` matching command of one client and the proxy drops
  the connection instead of forwarding the reply (`target` names the client and the command).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    SCHEDULER_KILL = "scheduler:kill"
    SCHEDULER_TERM = "scheduler:term"
    GATEWAY_KILL = "gateway:kill"
    GATEWAY_TERM = "gateway:term"
    VERIFIER_KILL = "verifier:kill"
    VERIFIER_TERM = "verifier:term"
    TRAINER_KILL = "trainer:kill"
    TRAINER_TERM = "trainer:term"
    REDIS_KILL = "redis:kill"
    REDIS_TERM = "redis:term"
    GATEWAY_STOP = "gateway:stop"
    REDIS_CONN_CUT = "redis-conn:cut"
    GATEWAY_CONN_CUT = "gateway-conn:cut"
    REDIS_LOST_REPLY = "redis:lost-reply"

    @property
    def service(self) -> str:
        """The service kind it hits (`gateway` for any gateway)."""
        return self.value.split(":")[0].removesuffix("-conn")

    @property
    def how(self) -> str:
        return self.value.split(":")[1]


# Every fault kind; REDIS_LOST_REPLY among them because the durability contract
# (docs/architecture.md) promises that any reply may be lost after the server acted on it, and the
# proxy can do it on any command.
DEFAULT_KINDS: tuple[FaultKind, ...] = tuple(FaultKind)

# Lost replies: (client, command) pairs. The scheduler's Lua scripts by name (asyncdapo.services.scheduler.lua);
# the trainer's scripts (stream read, drop, commit with its XACK and trim, fence renewal: any
# EVALSHA) and the prompt feed's RPUSH (inside MULTI: lost at EXEC).
LOST_REPLY_TARGETS: tuple[tuple[str, str], ...] = (
    ("scheduler", "claim"),
    ("scheduler", "record"),
    ("scheduler", "finish"),
    ("scheduler", "count"),
    ("scheduler", "lease"),
    ("trainer", "EVALSHA"),
    ("trainer", "RPUSH"),
)

STALENESS_S = 3.0  # a gateway's load report is stale after this long (the pool marks it down)


@dataclass(frozen=True)
class PlannedFault:
    index: int  # 1-based position in the schedule
    kind: FaultKind
    target: str  # service name (gateway-1, scheduler…), `<client>:<command>` for a lost reply
    duration_s: float  # how long the fault lasts before it is cleared (0: instantaneous)
    gap_s: float  # quiet time after the previous fault's recovery, before this one
    nth: int = 1  # lost reply: the nth matching command after arming
    # part of a burst: injected right after the previous fault cleared (gap_s after it), without
    # waiting for the run to recover or for every service to be ready again
    follows: bool = False

    def describe(self) -> str:
        extra = f" for {self.duration_s:.1f} s" if self.duration_s else ""
        nth = f" (#{self.nth})" if self.kind is FaultKind.REDIS_LOST_REPLY else ""
        burst = " (burst)" if self.follows else ""
        return f"#{self.index} {self.kind.value} {self.target}{nth}{extra}{burst}"


def plan(
    seed: int,
    count: int,
    gateways: int,
    kinds: tuple[FaultKind, ...] = DEFAULT_KINDS,
    max_gap_s: float = 2.0,
    burst_fraction: float = 0.0,
    max_burst: int = 3,
) -> list[PlannedFault]:
    """`count` faults drawn uniformly over `kinds` (the fault's timing within the step cycle comes
    from `gap_s`, uniform in [0, max_gap_s]). With `burst_fraction` > 0, each fault joins the
    previous one's burst with that probability (at most `max_burst` faults a burst): faults that
    overlap, e.g. the scheduler killed while Redis is still reloading."""
    if gateways < 1:
        raise ValueError(f"gateways must be >= 1, got {gateways}")
    if not kinds:
        raise ValueError("no fault kinds to draw from")
    rng = random.Random(seed)
    out: list[PlannedFault] = []
    for i in range(1, count + 1):
        kind = rng.choice(kinds)
        duration, nth = 0.0, 1
        if kind.service == "gateway":
            target = f"gateway-{rng.randrange(gateways)}"
        elif kind is FaultKind.REDIS_CONN_CUT:
            target = rng.choice(("scheduler", "trainer"))
        elif kind is FaultKind.REDIS_LOST_REPLY:
            client, cmd = rng.choice(LOST_REPLY_TARGETS)
            target = f"{client}:{cmd}"
            nth = rng.randint(1, 3)
        else:
            target = kind.service
        if kind in (FaultKind.REDIS_KILL, FaultKind.REDIS_TERM):
            duration = round(rng.uniform(0.0, 3.0), 1)
        elif kind is FaultKind.GATEWAY_STOP:
            duration = round(rng.uniform(STALENESS_S + 1.0, 10.0), 1)
        elif kind in (FaultKind.REDIS_CONN_CUT, FaultKind.GATEWAY_CONN_CUT):
            # half of the cuts also refuse reconnection for a while (a peer's port unreachable)
            duration = round(rng.uniform(1.0, 5.0), 1) if rng.random() < 0.5 else 0.0
        gap = round(rng.uniform(0.0, max_gap_s), 2)
        follows = False
        # a lost reply waits for its command to come by: it neither joins nor starts a burst
        lost = FaultKind.REDIS_LOST_REPLY
        if burst_fraction > 0 and rng.random() < burst_fraction and out and lost not in (kind, out[-1].kind):
            run = 1
            while run < len(out) and out[-run].follows:
                run += 1
            follows = run < max_burst
        out.append(PlannedFault(i, kind, target, duration, gap, nth, follows))
    return out


def parse_kinds(spec: str) -> tuple[FaultKind, ...]:
    """`all`, or a comma-separated list of kinds (`scheduler:kill,redis:term`) or of services
    (`redis` = every kind that hits Redis)."""
    if spec.strip() in ("", "all"):
        return DEFAULT_KINDS
    out: list[FaultKind] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        matches = [
            k for k in FaultKind if k.value == part or k.service == part or k.value.split(":")[0] == part
        ]
        if not matches:
            raise ValueError(f"unknown fault kind {part!r}; known: {', '.join(k.value for k in FaultKind)}")
        out += [k for k in matches if k not in out]
    return tuple(out)
