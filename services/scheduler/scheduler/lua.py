"""The Lua scripts behind every group-state and queue transition (one atomic step each).

All keys of a run share the hash tag `{run}`, so the prompt-state keys a script derives from
`prefix .. id` live in the same slot as the declared keys (legal on Redis Cluster too).

Prompt state HASH `prompt:{id}` (RunKeys.prompt): `attempt` (admissions so far), `n`, `done`,
Welford accumulators of the filter metric (`mean`, `m2`) and of the reward (`rmean`, `rm2`),
`vmin`/`vmax` (policy versions of the tokens), `r:{attempt}:{idx}` markers of responses already
counted, `o:{attempt}` the outcome of each attempt (set exactly once) and `outcome` (the latest).
Floats are returned as strings: Redis truncates Lua numbers to integers in replies.
"""

from __future__ import annotations

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

# KEYS: prompt.  ARGV: attempt, idx, metric, reward, vmin, vmax
# Returns {status, done, n, mean, std, rmean, rstd, vmin, vmax}; status ok|complete|dup|stale.
RECORD = """
local a = ARGV[1]
local st = redis.call('HMGET', KEYS[1], 'attempt', 'n', 'done', 'mean', 'm2', 'rmean', 'rm2',
                      'vmin', 'vmax', 'o:' .. a)
if st[1] ~= a or st[10] then return {'stale'} end
local n = tonumber(st[2])
local done = tonumber(st[3])
local mean, m2 = tonumber(st[4]), tonumber(st[5])
local rmean, rm2 = tonumber(st[6]), tonumber(st[7])
local vmin, vmax = st[8], st[9]
local status = 'ok'
if redis.call('HSETNX', KEYS[1], 'r:' .. a .. ':' .. ARGV[2], 1) == 0 then
  status = 'dup'
else
  done = done + 1
  local x = tonumber(ARGV[3])
  local d = x - mean
  mean = mean + d / done
  m2 = m2 + d * (x - mean)
  local r = tonumber(ARGV[4])
  local dr = r - rmean
  rmean = rmean + dr / done
  rm2 = rm2 + dr * (r - rmean)
  if vmin == '' or tonumber(ARGV[5]) < tonumber(vmin) then vmin = ARGV[5] end
  if vmax == '' or tonumber(ARGV[6]) > tonumber(vmax) then vmax = ARGV[6] end
  redis.call('HSET', KEYS[1], 'done', done, 'mean', string.format('%.17g', mean),
             'm2', string.format('%.17g', m2), 'rmean', string.format('%.17g', rmean),
             'rm2', string.format('%.17g', rm2), 'vmin', vmin, 'vmax', vmax)
end
if status == 'ok' and done >= n then status = 'complete' end
local std = math.sqrt(math.max(m2 / math.max(done, 1), 0))
local rstd = math.sqrt(math.max(rm2 / math.max(done, 1), 0))
return {status, tostring(done), tostring(n), string.format('%.17g', mean), string.format('%.17g', std),
        string.format('%.17g', rmean), string.format('%.17g', rstd), vmin, vmax}
"""

# KEYS: prompt, counters, claimed, prompts, groups.
# ARGV: pid, attempt, outcome (valid|filtered|requeued|dropped), reason, bound (-1: none),
#       group bytes, version
# The one place an attempt gets its outcome: exactly once, together with its side effects (the
# group XADDed and counted, the claim released, the prompt requeued at the queue head). A valid
# group at or past the bound becomes `requeued` (reason over_bound): the bound is never exceeded.
# Returns {label, valid_produced}; label is the outcome, `dropped:<reason>` for drops, or
# dup:<label> / stale when this attempt already had an outcome / is not the current attempt.
FINISH = """
local a = ARGV[2]
if redis.call('HGET', KEYS[1], 'attempt') ~= a then return {'stale', '0'} end
local of = 'o:' .. a
local prev = redis.call('HGET', KEYS[1], of)
local produced = tonumber(redis.call('HGET', KEYS[2], 'valid_produced') or '0')
if prev then return {'dup:' .. prev, tostring(produced)} end
local outcome, reason = ARGV[3], ARGV[4]
if outcome == 'valid' then
  local bound = tonumber(ARGV[5])
  if bound >= 0 and produced >= bound then
    outcome, reason = 'requeued', 'over_bound'
  else
    redis.call('XADD', KEYS[5], '*', 'g', ARGV[6])
    produced = redis.call('HINCRBY', KEYS[2], 'valid_produced', 1)
    redis.call('HINCRBY', KEYS[2], 'valid_v:' .. ARGV[7], 1)
  end
end
local label = outcome
if outcome == 'dropped' then label = 'dropped:' .. reason end
if outcome == 'requeued' then
  redis.call('HINCRBY', KEYS[2], 'requeued:' .. reason, 1)
  redis.call('LPUSH', KEYS[4], ARGV[1])
end
redis.call('HINCRBY', KEYS[2], 'outcome:' .. label, 1)
redis.call('HSET', KEYS[1], of, label, 'outcome', label)
redis.call('HDEL', KEYS[3], ARGV[1])
local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
if n > 0 then
  local f = {}
  for i = 0, n - 1 do f[#f + 1] = 'r:' .. a .. ':' .. i end
  redis.call('HDEL', KEYS[1], unpack(f))
end
return {label, tostring(produced)}
"""

SCRIPTS: dict[str, str] = {"claim": CLAIM, "record": RECORD, "finish": FINISH}
