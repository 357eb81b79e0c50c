-- scheduler_finish: the one place an attempt gets its outcome: exactly once, together with its
-- side effects (the group XADDed and counted, the claim released, the prompt requeued at the queue
-- head, the audit entry in `outcomes`), in ARGV order. Once an outcome is final (valid, filtered,
-- dropped) the prompt's data is deleted, its state keeps only `attempt` and the outcomes
-- (`o:{attempt}` and `outcome`) and expires after final_ttl_s.
-- The bound and the staleness rule apply to the effective count
-- `valid_produced - valid_credited` (groups the trainer dropped are credited back): a valid group at
-- or past the bound becomes `requeued(over_bound)`; a valid group that the step consuming it would
-- find stale becomes `requeued(stale)` - the trainer reads the stream in order, B groups per step,
-- so the group at effective position k is trained by step floor(k / B) and is trainable there only
-- if min_version >= floor(k / B) - w. (That step is never older than the published version v - the
-- trainer has consumed v*B groups - so max(floor(k / B), v) is used: a defence against counters
-- that disagree with the trainer, e.g. a stream reset by hand.)
-- KEYS: [1] counters, [2] prompts:claimed, [3] prompts, [4] groups, [5] scheduler:epoch,
--   [6] outcomes, then per attempt its prompt key (RunKeys.prompt) and its prompt data key
--   (RunKeys.prompt_data).
-- ARGV: [1] epoch, [2] train_batch_size B, [3] staleness window w = ceil(s)
--   (`RunConfig.staleness_window`), [4] final_ttl_s, [5] outcomes_maxlen, [6] policy version v,
--   then per attempt (FINISH_FIELDS = 7 entries after FINISH_HEADER = 6):
--   pid, attempt, outcome (valid|filtered|requeued|dropped), reason,
--   bound (floor((v + 1 + s)*B), `RunConfig.valid_group_bound`; -1: none),
--   group bytes, min_version (valid only: the oldest token version of the group)
-- Returns: one {label, valid_produced, valid_credited} per attempt; label is the outcome,
--   `dropped:<reason>` / `requeued:<reason>`, or dup:<stored label> (a repeat) / stale / fenced.
-- Called by: GroupStore.finish_many (asyncdapo.services.scheduler.group_state), as SCRIPTS["finish"].

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
