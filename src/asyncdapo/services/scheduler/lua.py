"""The Lua scripts behind every group-state and queue transition (one atomic step per item; a
batch of items per call, so a whole verifier batch costs one command and one round trip).

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

RECORD_FIELDS = 1  # ARGV entries per response in RECORD (one packed string)
FINISH_HEADER = 6  # ARGV entries before the per-attempt entries of FINISH
FINISH_FIELDS = 7  # ARGV entries per attempt in FINISH

# KEYS: epoch, lease.  ARGV: owner, lease_ms.  Returns the new epoch.
TAKEOVER = """
local e = redis.call('INCR', KEYS[1])
redis.call('SET', KEYS[2], ARGV[1] .. '|' .. e, 'PX', ARGV[2])
return e
"""

# KEYS: epoch, lease.  ARGV: owner, epoch, lease_ms.
# Returns 1 (lease refreshed), 0 (fenced: another scheduler took over), -1 (the epoch is gone:
# Redis lost the run's state; the caller takes over again).
LEASE = """
local cur = redis.call('GET', KEYS[1])
if not cur then return -1 end
if cur ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[2], ARGV[1] .. '|' .. ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS: lease.  ARGV: owner|epoch.  Deletes the lease only if it is still ours.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: prompts, claimed, counters, epoch, token key.
# ARGV: max_count, owner, now_ms, prompt_key_prefix, n, epoch, token_ttl_s
# Returns {'fenced'} or {'ok', admitted_total, pid1, attempt1, pid2, attempt2, ...}. A retry with
# the same token (its first reply was lost) gets the first call's reply and claims nothing more.
CLAIM = """
if redis.call('GET', KEYS[4]) ~= ARGV[6] then return {'fenced'} end
local prev = redis.call('GET', KEYS[5])
if prev then return cjson.decode(prev) end
local out = {'ok', '0'}
for i = 1, tonumber(ARGV[1]) do
  local pid = redis.call('LPOP', KEYS[1])
  if not pid then break end
  local pk = ARGV[4] .. pid
  local attempt = redis.call('HINCRBY', pk, 'attempt', 1)
  redis.call('PERSIST', pk)
  redis.call('HSET', pk, 'n', ARGV[5], 'done', 0, 'mean', 0, 'm2', 0, 'rmean', 0, 'rm2', 0,
             'vmin', '', 'vmax', '', 'owner', ARGV[2], 'claimed_ms', ARGV[3])
  redis.call('HSET', KEYS[2], pid, ARGV[2] .. '|' .. attempt .. '|' .. ARGV[3])
  out[#out + 1] = pid
  out[#out + 1] = tostring(attempt)
end
local claimed = (#out - 2) / 2
out[2] = tostring(redis.call('HINCRBY', KEYS[3], 'admitted', claimed))
redis.call('SET', KEYS[5], cjson.encode(out), 'EX', ARGV[7])
return out
"""

# KEYS: counters, epoch, then the prompt key of each response.
# ARGV: epoch, then per response one string "attempt idx metric reward vmin vmax length"
# (one argument, not seven: the client's command packing costs per argument, and this script
# runs once per scored batch of up to 64 responses).
# Returns one reply per response: {status, done, n[, mean, std, rmean, rstd, vmin, vmax]}, status
# ok|complete|dup|stale|fenced; the statistics only when the group is complete or the response a
# duplicate (small replies for the common case). `completions` and `generated_tokens` count the
# responses counted here for the first time (never a retry's).
RECORD = """
local out = {}
local fenced = redis.call('GET', KEYS[2]) ~= ARGV[1]
local completions, tokens = 0, 0
for i = 3, #KEYS do
  local key = KEYS[i]
  local a, idx, xs, rs, v1, v2, len = string.match(ARGV[i - 1],
    '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  local st = fenced and {} or redis.call('HMGET', key, 'attempt', 'n', 'done', 'mean', 'm2',
                                        'rmean', 'rm2', 'vmin', 'vmax', 'o:' .. a)
  if fenced then
    out[#out + 1] = {'fenced'}
  elseif st[1] ~= a or st[10] then
    out[#out + 1] = {'stale'}
  else
    local n = tonumber(st[2])
    local done = tonumber(st[3])
    local mean, m2 = tonumber(st[4]), tonumber(st[5])
    local rmean, rm2 = tonumber(st[6]), tonumber(st[7])
    local vmin, vmax = st[8], st[9]
    local status = 'ok'
    if redis.call('HSETNX', key, 'r:' .. a .. ':' .. idx, 1) == 0 then
      status = 'dup'
    else
      completions = completions + 1
      tokens = tokens + tonumber(len)
      done = done + 1
      local x = tonumber(xs)
      local d = x - mean
      mean = mean + d / done
      m2 = m2 + d * (x - mean)
      local r = tonumber(rs)
      local dr = r - rmean
      rmean = rmean + dr / done
      rm2 = rm2 + dr * (r - rmean)
      if vmin == '' or tonumber(v1) < tonumber(vmin) then vmin = v1 end
      if vmax == '' or tonumber(v2) > tonumber(vmax) then vmax = v2 end
      redis.call('HSET', key, 'done', done, 'mean', string.format('%.17g', mean),
                 'm2', string.format('%.17g', m2), 'rmean', string.format('%.17g', rmean),
                 'rm2', string.format('%.17g', rm2), 'vmin', vmin, 'vmax', vmax)
      if done >= n then status = 'complete' end
    end
    if status == 'ok' then
      out[#out + 1] = {status, tostring(done), tostring(n)}
    else
      local std = math.sqrt(math.max(m2 / math.max(done, 1), 0))
      local rstd = math.sqrt(math.max(rm2 / math.max(done, 1), 0))
      out[#out + 1] = {status, tostring(done), tostring(n), string.format('%.17g', mean),
                string.format('%.17g', std), string.format('%.17g', rmean),
                string.format('%.17g', rstd), vmin, vmax}
    end
  end
end
if completions > 0 then
  redis.call('HINCRBY', KEYS[1], 'completions', completions)
  redis.call('HINCRBY', KEYS[1], 'generated_tokens', tokens)
end
return out
"""

# KEYS: counters, claimed, prompts, groups, epoch, outcomes, then per attempt its prompt key and
# its prompt data key.
# ARGV: epoch, train_batch_size B, staleness window w = ceil(s) (`RunConfig.staleness_window`),
# final_ttl_s, outcomes_maxlen, policy version v,
# then per attempt:
#   pid, attempt, outcome (valid|filtered|requeued|dropped), reason,
#   bound (floor((v + 1 + s)·B), `RunConfig.valid_group_bound`; -1: none),
#   group bytes, min_version (valid only: the oldest token version of the group)
# The one place an attempt gets its outcome: exactly once, together with its side effects (the
# group XADDed and counted, the claim released, the prompt requeued at the queue head, the audit
# entry), in ARGV order. The bound and the staleness rule apply to the effective count
# `valid_produced - valid_credited` (groups the trainer dropped are credited back): a valid group at
# or past the bound becomes `requeued(over_bound)`; a valid group that the step consuming it would
# find stale becomes `requeued(stale)` — the trainer reads the stream in order, B groups per step,
# so the group at effective position k is trained by step floor(k / B) and is trainable there only
# if min_version >= floor(k / B) - w. (That step is never older than the published version v — the
# trainer has consumed v·B groups — so max(floor(k / B), v) is used: a defence against counters
# that disagree with the trainer, e.g. a stream reset by hand.) Returns one {label, valid_produced, valid_credited} per attempt;
# label is the outcome, `dropped:<reason>` / `requeued:<reason>`, or dup:<stored label> / stale / fenced.
FINISH = """
local out = {}
local counters, claimed, prompts, groups = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local produced = tonumber(redis.call('HGET', counters, 'valid_produced') or '0')
local credited = tonumber(redis.call('HGET', counters, 'valid_credited') or '0')
local count = (#KEYS - 6) / 2
if redis.call('GET', KEYS[5]) ~= ARGV[1] then
  for i = 1, count do out[i] = {'fenced', tostring(produced), tostring(credited)} end
  return out
end
local B, w, ttl, v = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
for i = 1, count do
  local key, dkey = KEYS[5 + 2 * i], KEYS[6 + 2 * i]
  local b = 6 + (i - 1) * 7
  local pid, a = ARGV[b + 1], ARGV[b + 2]
  if redis.call('HGET', key, 'attempt') ~= a then
    out[i] = {'stale', tostring(produced), tostring(credited)}
  else
    local of = 'o:' .. a
    local prev = redis.call('HGET', key, of)
    if prev then
      out[i] = {'dup:' .. prev, tostring(produced), tostring(credited)}
    else
      local outcome, reason = ARGV[b + 3], ARGV[b + 4]
      if outcome == 'valid' then
        local bound = tonumber(ARGV[b + 5])
        local eff = produced - credited
        if bound >= 0 and eff >= bound then
          outcome, reason = 'requeued', 'over_bound'
        elseif tonumber(ARGV[b + 7]) < math.max(math.floor(eff / B), v) - w then
          outcome, reason = 'requeued', 'stale'
        else
          redis.call('XADD', groups, '*', 'g', ARGV[b + 6])
          produced = redis.call('HINCRBY', counters, 'valid_produced', 1)
        end
      end
      -- stored label: the outcome, `dropped:<reason>` for drops (counted under `outcome:<label>`);
      -- a requeue's reason is counted under `requeued:<reason>` and returned in the reply
      local label = outcome
      if outcome == 'dropped' then label = 'dropped:' .. reason end
      local full = label
      if outcome == 'requeued' then
        full = 'requeued:' .. reason
        redis.call('HINCRBY', counters, 'requeued:' .. reason, 1)
        redis.call('LPUSH', prompts, pid)
      end
      redis.call('HINCRBY', counters, 'outcome:' .. label, 1)
      redis.call('HSET', key, of, label, 'outcome', label)
      redis.call('HDEL', claimed, pid)
      local n = tonumber(redis.call('HGET', key, 'n') or '0')
      if n > 0 then
        local f = {}
        for j = 0, n - 1 do f[#f + 1] = 'r:' .. a .. ':' .. j end
        redis.call('HDEL', key, unpack(f))
      end
      if outcome ~= 'requeued' then
        redis.call('DEL', dkey)
        redis.call('HDEL', key, 'n', 'done', 'mean', 'm2', 'rmean', 'rm2', 'vmin', 'vmax',
                   'owner', 'claimed_ms')
        redis.call('EXPIRE', key, ttl)
      end
      redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[5], '*', 'p', pid, 'a', a, 'o', full,
                 'e', ARGV[1])
      out[i] = {full, tostring(produced), tostring(credited)}
    end
  end
end
return out
"""

# KEYS: counters, sequence key of the caller.  ARGV: seq, ttl_s, then field, delta pairs.
# Applies the increments once per sequence number (a retry after a lost reply is a no-op).
COUNT = """
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""

SCRIPTS: dict[str, str] = {
    "takeover": TAKEOVER,
    "lease": LEASE,
    "release": RELEASE,
    "claim": CLAIM,
    "record": RECORD,
    "finish": FINISH,
    "count": COUNT,
}
