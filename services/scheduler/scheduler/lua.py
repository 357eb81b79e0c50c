"""The Lua scripts behind every group-state and queue transition (one atomic step per item; a
batch of items per call, so a whole verifier batch costs one command and one round trip).

All keys of a run share the hash tag `{run}` and are declared in KEYS (the claim script derives
prompt keys from `prefix .. id`, the same slot), so the scripts are legal on Redis Cluster too.

Prompt state HASH `prompt:{id}` (RunKeys.prompt): `attempt` (admissions so far), `n`, `done`,
Welford accumulators of the filter metric (`mean`, `m2`) and of the reward (`rmean`, `rm2`),
`vmin`/`vmax` (policy versions of the tokens), `r:{attempt}:{idx}` markers of responses already
counted, `o:{attempt}` the outcome of each attempt (set exactly once) and `outcome` (the latest).
Floats are returned as strings: Redis truncates Lua numbers to integers in replies.
"""

from __future__ import annotations

RECORD_FIELDS = 1  # ARGV entries per response in RECORD (one packed string)
FINISH_FIELDS = 7  # ARGV entries per attempt in FINISH

# KEYS: prompts, claimed, counters.  ARGV: max_count, owner, now_ms, prompt_key_prefix, n
CLAIM = """
local out = {}
for i = 1, tonumber(ARGV[1]) do
  local pid = redis.call('LPOP', KEYS[1])
  if not pid then break end
  local pk = ARGV[4] .. pid
  local attempt = redis.call('HINCRBY', pk, 'attempt', 1)
  redis.call('HSET', pk, 'n', ARGV[5], 'done', 0, 'mean', 0, 'm2', 0, 'rmean', 0, 'rm2', 0,
             'vmin', '', 'vmax', '', 'owner', ARGV[2], 'claimed_ms', ARGV[3])
  redis.call('HSET', KEYS[2], pid, ARGV[2] .. '|' .. attempt .. '|' .. ARGV[3])
  out[#out + 1] = pid
  out[#out + 1] = tostring(attempt)
end
if #out > 0 then redis.call('HINCRBY', KEYS[3], 'admitted', #out / 2) end
return out
"""

# KEYS: the prompt key of each response.  ARGV, per response: one string
# "attempt idx metric reward vmin vmax" (one argument, not six: the client's command packing
# costs per argument, and this script runs once per scored batch of up to 64 responses)
# Returns one reply per response: {status, done, n[, mean, std, rmean, rstd, vmin, vmax]}, status
# ok|complete|dup|stale; the statistics only when the group is complete or the response a
# duplicate (small replies for the common case).
RECORD = """
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local a, idx, xs, rs, v1, v2 = string.match(ARGV[i], '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
  local st = redis.call('HMGET', key, 'attempt', 'n', 'done', 'mean', 'm2', 'rmean', 'rm2',
                        'vmin', 'vmax', 'o:' .. a)
  if st[1] ~= a or st[10] then
    out[i] = {'stale'}
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
      out[i] = {status, tostring(done), tostring(n)}
    else
      local std = math.sqrt(math.max(m2 / math.max(done, 1), 0))
      local rstd = math.sqrt(math.max(rm2 / math.max(done, 1), 0))
      out[i] = {status, tostring(done), tostring(n), string.format('%.17g', mean),
                string.format('%.17g', std), string.format('%.17g', rmean),
                string.format('%.17g', rstd), vmin, vmax}
    end
  end
end
return out
"""

# KEYS: counters, claimed, prompts, groups, then the prompt key of each attempt.
# ARGV, per attempt: pid, attempt, outcome (valid|filtered|requeued|dropped), reason,
#   bound (-1: none), group bytes, version
# The one place an attempt gets its outcome: exactly once, together with its side effects (the
# group XADDed and counted, the claim released, the prompt requeued at the queue head), in ARGV
# order. A valid group at or past the bound becomes `requeued` (reason over_bound): the bound is
# never exceeded. Returns one {label, valid_produced} per attempt; label is the outcome,
# `dropped:<reason>` for drops, or dup:<label> / stale when this attempt already had an outcome /
# is not the current attempt.
FINISH = """
local out = {}
local counters, claimed, prompts, groups = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local produced = tonumber(redis.call('HGET', counters, 'valid_produced') or '0')
for i = 5, #KEYS do
  local key = KEYS[i]
  local b = (i - 5) * 7
  local pid, a = ARGV[b + 1], ARGV[b + 2]
  if redis.call('HGET', key, 'attempt') ~= a then
    out[#out + 1] = {'stale', tostring(produced)}
  else
    local of = 'o:' .. a
    local prev = redis.call('HGET', key, of)
    if prev then
      out[#out + 1] = {'dup:' .. prev, tostring(produced)}
    else
      local outcome, reason = ARGV[b + 3], ARGV[b + 4]
      if outcome == 'valid' then
        local bound = tonumber(ARGV[b + 5])
        if bound >= 0 and produced >= bound then
          outcome, reason = 'requeued', 'over_bound'
        else
          redis.call('XADD', groups, '*', 'g', ARGV[b + 6])
          produced = redis.call('HINCRBY', counters, 'valid_produced', 1)
          redis.call('HINCRBY', counters, 'valid_v:' .. ARGV[b + 7], 1)
        end
      end
      local label = outcome
      if outcome == 'dropped' then label = 'dropped:' .. reason end
      if outcome == 'requeued' then
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
      out[#out + 1] = {label, tostring(produced)}
    end
  end
end
return out
"""

SCRIPTS: dict[str, str] = {"claim": CLAIM, "record": RECORD, "finish": FINISH}
