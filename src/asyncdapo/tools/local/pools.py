"""Gateway pools of the local stack: `asyncdapo up --pools fast=1,heavy=1`.

Each gateway reports a pool label (`asyncdapo gateway --pool`) and the scheduler's dispatch filter
places a request that asks for a pool only on gateways carrying it (a request that asks for none
goes anywhere). The long-tail policy `pdsr` asks for `fast` and `heavy`: without both it falls back
to any gateway, i.e. probe-then-rest on one pool.
"""

from __future__ import annotations

import re

from asyncdapo.contracts.errors import AsyncdapoError

PDSR_POOLS = ("fast", "heavy")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")


class PoolSpecError(AsyncdapoError, ValueError):
    pass


def parse_pools(text: str) -> list[str]:
    """`fast=3,heavy=1` -> the label of each gateway in start order (fast, fast, fast, heavy)."""
    labels: list[str] = []
    seen: set[str] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, count = part.partition("=")
        name = name.strip()
        if not sep or not _LABEL.match(name):
            raise PoolSpecError(
                f"--pools {text!r}: {part!r} is not LABEL=COUNT with a lowercase label "
                "(letters, digits, '-'), e.g. fast=1,heavy=1"
            )
        if name in seen:
            raise PoolSpecError(f"--pools {text!r}: pool {name!r} is given twice")
        try:
            n = int(count)
        except ValueError:
            n = -1
        if n < 1:
            raise PoolSpecError(f"--pools {text!r}: pool {name!r} needs a count >= 1, got {count.strip()!r}")
        seen.add(name)
        labels += [name] * n
    if not labels:
        raise PoolSpecError(f"--pools {text!r}: no pool given (e.g. fast=1,heavy=1)")
    return labels


def gateway_labels(pools: str | None, gateways: int | None) -> list[str]:
    """The pool label of each gateway ("" = no pool) from `--pools` and `--gateways` (default 2);
    both given, they must agree."""
    if pools is None:
        n = 2 if gateways is None else gateways
        if n < 1:
            raise PoolSpecError(f"--gateways must be >= 1, got {n}")
        return [""] * n
    labels = parse_pools(pools)
    if gateways is not None and gateways != len(labels):
        raise PoolSpecError(
            f"--gateways {gateways} disagrees with --pools {pools!r} ({len(labels)} gateways)"
        )
    return labels


def pdsr_pool_note(policy: str, labels: list[str]) -> str | None:
    """A warning when `pdsr` runs without its two pools (it then degenerates to one pool)."""
    if policy != "pdsr" or all(p in labels for p in PDSR_POOLS):
        return None
    return (
        "rollout.long_tail.policy pdsr without gateways in both pools fast and heavy: every response runs "
        "on any gateway (probe, then the rest, on one pool); pass e.g. --pools fast=1,heavy=1"
    )
