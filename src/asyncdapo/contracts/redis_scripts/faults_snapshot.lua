-- faults_snapshot: one atomic read of a run's control state for the invariant checker: prompt
-- state, claims, counters, the queue, the scheduler's lease, the groups stream's entries-added and
-- the published version, read by one script: a consistent snapshot, so a FINISH or a CLAIM landing
-- between two reads can never look like a violation. KEYS/TIME in a script are fine on a
-- standalone Redis (the harness's); on a cluster the run's keys share one slot anyway.
-- KEYS: none (the script derives the run's keys from its prefix)
-- ARGV: [1] the run's key prefix (RunKeys.prefix), [2] the same prefix glob-escaped (for KEYS)
-- Returns: {TIME, {key, HGETALL, ...} of every prompt state hash, HGETALL prompts:claimed,
--   HGETALL counters, LRANGE prompts, scheduler:lease or '', groups entries-added,
--   weights version or ''}.
-- Called by: read_snapshot (asyncdapo.tools.faults.snapshot).

local prefix = ARGV[1]
local pat = ARGV[2]
local prompts = {}
local plen = string.len(prefix .. 'prompt:')
for _, k in ipairs(redis.call('KEYS', pat .. 'prompt:*')) do
  -- prompt state only: not `prompt:{id}:data` nor any other `prompt:{id}:…` key
  if not string.find(string.sub(k, plen + 1), ':', 1, true) and redis.call('TYPE', k).ok == 'hash' then
    prompts[#prompts + 1] = k
    prompts[#prompts + 1] = redis.call('HGETALL', k)
  end
end
local added = 0
if redis.call('EXISTS', prefix .. 'groups') == 1 then
  local info = redis.call('XINFO', 'STREAM', prefix .. 'groups')
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then added = info[i + 1] end
  end
end
return {redis.call('TIME'), prompts, redis.call('HGETALL', prefix .. 'prompts:claimed'),
        redis.call('HGETALL', prefix .. 'counters'), redis.call('LRANGE', prefix .. 'prompts', 0, -1),
        redis.call('GET', prefix .. 'scheduler:lease') or '', added,
        redis.call('HGET', prefix .. 'weights', 'version') or ''}
