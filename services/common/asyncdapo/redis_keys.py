"""The Redis layout shared by scheduler and trainer (DESIGN.md, "Redis").

Every key of a run lives under `asyncdapo:{run}:`; the braces make it a Redis Cluster hash tag, so
a run's keys share one slot and multi-key Lua scripts stay legal on a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUPS_CONSUMER_GROUP = "trainer"
GROUP_FIELD = "g"  # stream field holding a serialized asyncdapo.v1.Group


@dataclass(frozen=True)
class RunKeys:
    run: str

    @property
    def prefix(self) -> str:
        return f"asyncdapo:{{{self.run}}}:"

    @property
    def prompts(self) -> str:
        """LIST of prompt ids waiting to be admitted (head = next)."""
        return self.prefix + "prompts"

    @property
    def prompts_claimed(self) -> str:
        """HASH prompt id -> claim record of prompts taken by a scheduler and not yet finished."""
        return self.prefix + "prompts:claimed"

    def prompt(self, prompt_id: str) -> str:
        """HASH group state of one prompt: n, done, reward sums, version range, outcome."""
        return f"{self.prefix}prompt:{prompt_id}"

    def prompt_data(self, prompt_id: str) -> str:
        """HASH the prompt itself: token ids / text, ground truth, data source."""
        return f"{self.prefix}prompt:{prompt_id}:data"

    @property
    def groups(self) -> str:
        """STREAM one entry per valid group, consumer group `trainer`."""
        return self.prefix + "groups"

    @property
    def counters(self) -> str:
        """HASH run counters: outcomes, valid groups produced, early stops, aborted tokens…"""
        return self.prefix + "counters"

    @property
    def weights(self) -> str:
        """HASH current policy version and snapshot uri."""
        return self.prefix + "weights"
