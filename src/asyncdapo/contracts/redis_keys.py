"""The Redis layout shared by scheduler and trainer (DESIGN.md, "Redis").

Every key of a run lives under `asyncdapo:{run}:`; the braces make it a Redis Cluster hash tag, so
a run's keys share one slot and multi-key Lua scripts stay legal on a cluster. The scripts that
read and write these keys are part of the same contract: `asyncdapo.contracts.redis_scripts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GROUPS_CONSUMER_GROUP = "trainer"
GROUP_FIELD = "g"  # stream field holding a serialized asyncdapo.v1.Group

# Fields of the `counters` HASH that the scheduler and the trainer share (the bound of fully async
# rollout applies to VALID_PRODUCED - VALID_CREDITED).
VALID_PRODUCED = "valid_produced"  # valid groups XADDed (the scheduler's FINISH script)
# valid groups the trainer will never train (dropped), credited back to the bound; incremented in
# the same atomic script as the XACK of those entries, once per entry (`RunKeys.trainer_credited`)
VALID_CREDITED = "valid_credited"
TRAINER_DROPPED_PREFIX = "trainer:dropped:"  # + GroupDropReason (trainer): groups dropped, by reason
TRAINER_REDELIVERED = "trainer:redelivered"  # entries delivered again after being processed
TRAINER_PROMPTS_TOO_LONG = "trainer:prompts_too_long"  # prompts the feed skipped (over max length)
TRAINER_PROMPTS_QUEUED = "trainer:prompts_queued"  # prompts the feed pushed
# the scheduler's own fields (its Lua scripts write the same names)
OUTCOME_PREFIX = "outcome:"  # + outcome label: prompts finished, by outcome
COMPLETIONS = "completions"
GENERATED_TOKENS = "generated_tokens"
EARLY_STOPS = "early_stops"
ABORTED_TOKENS = "aborted_tokens"
ABORTED_REQUESTS = "aborted_requests"


def text(v: object) -> str:
    """A Redis reply value as text (clients may run with or without decode_responses)."""
    return v.decode() if isinstance(v, bytes | bytearray) else str(v)


def decode_map(raw: Mapping[object, object]) -> dict[str, str]:
    """An HGETALL reply as str -> str."""
    return {text(k): text(v) for k, v in raw.items()}


def decode_counters(raw: Mapping[object, object]) -> dict[str, int]:
    """The `counters` HASH (or any hash of integers) as str -> int."""
    return {text(k): int(text(v)) for k, v in raw.items()}


def outcome_counts(counters: Mapping[str, int]) -> dict[str, int]:
    """The `outcome:<label>` fields of decoded counters, by label."""
    n = len(OUTCOME_PREFIX)
    return {k[n:]: v for k, v in counters.items() if k.startswith(OUTCOME_PREFIX)}


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

    @property
    def trainer_feed(self) -> str:
        """HASH {epoch, position}: the trainer's prompt-feed cursor (moves with the queued prompts)."""
        return self.prefix + "trainer:feed"

    @property
    def trainer_lease(self) -> str:
        """STRING id of the trainer that may write, with a PX lease its heartbeat keeps renewing."""
        return self.prefix + "trainer:lease"

    @property
    def trainer_epoch(self) -> str:
        """INT fencing epoch, INCRed each time a trainer acquires the lease (PublishWeights carries it)."""
        return self.prefix + "trainer:epoch"

    @property
    def trainer_credited(self) -> str:
        """ZSET stream ids of dropped groups already credited (score: the id's milliseconds): a
        credit is added only together with its marker, so a retry, a redelivery or a Redis rollback
        never credits a group twice or loses its credit. Pruned with the stream's trimming."""
        return self.prefix + "trainer:credited"

    @property
    def trainer_owner(self) -> str:
        """STRING id of the trainer that took the current epoch (no expiry): only it may re-take an
        expired lease without a new epoch (after a Redis outage longer than the lease)."""
        return self.prefix + "trainer:owner"

    # --- scheduler ownership, idempotency and audit (asyncdapo.services.scheduler.lua) ---

    @property
    def scheduler_epoch(self) -> str:
        """STRING fencing epoch: INCR by each scheduler that takes the run over; the scripts refuse
        writes from any other epoch."""
        return self.prefix + "scheduler:epoch"

    @property
    def scheduler_lease(self) -> str:
        """STRING `owner|epoch` of the live scheduler, PX lease (15 s) refreshed every second."""
        return self.prefix + "scheduler:lease"

    def claim_token(self, token: str) -> str:
        """STRING the reply of one CLAIM call (EX CLAIM_TOKEN_TTL_S), so a retried call claims
        nothing twice (a retry after longer claims anew; reconciliation requeues the first claims)."""
        return f"{self.prefix}claim:{token}"

    def count_seq(self, owner: str) -> str:
        """STRING the last counter batch applied for one scheduler process (COUNT script)."""
        return f"{self.prefix}countseq:{owner}"

    @property
    def outcomes(self) -> str:
        """STREAM the audit trail: one entry per recorded outcome (`p` prompt id, `a` attempt,
        `o` label with reason, `e` scheduler epoch), capped at OUTCOMES_MAXLEN (approximate): a
        checker that needs every outcome reads it as it goes."""
        return self.prefix + "outcomes"


# More counter fields of `RunKeys.counters` and limits of the scheduler's keys.
ADMITTED = "admitted"  # prompt attempts claimed (scheduler, CLAIM)
# Memory stays bounded by what is in flight plus these windows (bench/bench_soak.py measures it):
OUTCOMES_MAXLEN = 4096  # audit entries kept (approximate MAXLEN; a checker reads it as it goes)
FINISHED_PROMPT_TTL_S = 60  # a finished prompt's compacted state lives this long (a repeat's `dup:`)
CLAIM_TOKEN_TTL_S = 60  # a CLAIM's reply is kept this long for a retry of the same call
