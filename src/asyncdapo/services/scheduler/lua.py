"""The Lua scripts behind every group-state and queue transition (one atomic step per item; a
batch of items per call, so a whole verifier batch costs one command and one round trip).

The scripts live in `asyncdapo/contracts/redis_scripts/scheduler_*.lua` (each file's header: its
KEYS, ARGV and reply); this module names them for the scheduler (`SCRIPTS`, by the short names
`ScriptRunner` and the fault proxy use) and holds the ARGV layout constants.

All keys of a run share the hash tag `{run}` and are declared in KEYS (the claim script derives
prompt keys from `prefix .. id`, the same slot), so the scripts are legal on Redis Cluster too.

Fencing: one scheduler owns a run at a time. `TAKEOVER` increments `scheduler:epoch`; every script
that changes the queue or an outcome (CLAIM, RECORD, FINISH) first checks that the caller's epoch
is still the current one and otherwise changes nothing and answers `fenced`. A scheduler that was
replaced can therefore never write over its successor, however late its calls arrive.

Idempotency (a reply may be lost after Redis acted): CLAIM carries a client token and answers a
retry with the first call's reply; RECORD counts a response once (`r:{attempt}:{idx}` markers) and
keeps the completion counters inside the script; FINISH sets an attempt's outcome once and answers
a repeat with `dup:<label>`; COUNT applies a batch of counter increments once per sequence number.

Prompt state HASH `prompt:{id}` (RunKeys.prompt): `attempt` (admissions so far), `n`, `done`,
Welford accumulators of the filter metric (`mean`, `m2`) and of the reward (`rmean`, `rm2`),
`vmin`/`vmax` (policy versions of the tokens), `r:{attempt}:{idx}` markers of responses already
counted, `o:{attempt}` the outcome of each attempt (set exactly once) and `outcome` (the latest).
Once an outcome is final (valid, filtered, dropped) FINISH deletes the prompt's data, keeps only
`attempt` and the outcomes, and lets the hash expire after a TTL (60 s); the `outcomes` stream
(capped) is the audit trail of every outcome. Floats are returned as strings: Redis truncates Lua
numbers to integers in replies.
"""

from __future__ import annotations

from asyncdapo.contracts.redis_scripts import RedisScript, script

RECORD_FIELDS = 1  # ARGV entries per response in RECORD (one packed string)
FINISH_HEADER = 6  # ARGV entries before the per-attempt entries of FINISH
FINISH_FIELDS = 7  # ARGV entries per attempt in FINISH

TAKEOVER = script(RedisScript.SCHEDULER_TAKEOVER)
LEASE = script(RedisScript.SCHEDULER_LEASE)
RELEASE = script(RedisScript.SCHEDULER_RELEASE)
CLAIM = script(RedisScript.SCHEDULER_CLAIM)
RECORD = script(RedisScript.SCHEDULER_RECORD)
FINISH = script(RedisScript.SCHEDULER_FINISH)
COUNT = script(RedisScript.SCHEDULER_COUNT)

SCRIPTS: dict[str, str] = {
    "takeover": TAKEOVER,
    "lease": LEASE,
    "release": RELEASE,
    "claim": CLAIM,
    "record": RECORD,
    "finish": FINISH,
    "count": COUNT,
}
