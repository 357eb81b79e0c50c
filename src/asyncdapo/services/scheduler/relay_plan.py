"""Who a gateway pulls a stream:// version from: a tree rooted at the trainer (pure).

With fan-out k the trainer feeds the first k gateways and gateway j feeds gateways k + j·k …
k + j·k + k − 1, so the trainer sends k copies however many gateways there are, no gateway sends
more than k, and a chunk reaches the deepest gateway after ⌈log_k N⌉ hops (relays stream chunks
as they arrive, so the hops overlap). A gateway falls back to the trainer itself (the uri's
server, always tried last) when its parent fails or stalls.
"""

from __future__ import annotations

from collections.abc import Sequence


def tree_sources(targets: Sequence[str], fanout: int) -> dict[str, list[str]]:
    """Each target's sources to try before the trainer: its parent, when it has one."""
    if fanout < 1:
        raise ValueError(f"fanout must be >= 1, got {fanout}")
    return {a: ([] if i < fanout else [targets[(i - fanout) // fanout]]) for i, a in enumerate(targets)}


def resync_sources(holders: Sequence[str], limit: int = 3) -> list[str]:
    """A gateway catching up pulls from gateways that already serve the version (they need no
    trainer, which may be away), at most `limit` of them, before the trainer."""
    return list(holders[:limit])
