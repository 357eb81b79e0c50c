-- scheduler_claim: take up to max_count prompt ids from the head of the queue; each starts its next
-- attempt (`attempt` + 1) with a fresh group state of size n in `prompt:{id}` (RunKeys.prompt) and
-- is recorded in `prompts:claimed` as `owner|attempt|claimed_ms`. Prompt keys are derived from
-- `prefix .. id` (the same hash slot `{run}` as the declared KEYS, so legal on Redis Cluster).
-- Idempotent: the caller's client token keys the first reply (EX token_ttl_s); a retry with the
-- same token (its first reply was lost) gets the first call's reply and claims nothing more.
-- Fenced: a caller whose epoch is not the current one changes nothing.
-- KEYS: [1] prompts, [2] prompts:claimed, [3] counters, [4] scheduler:epoch,
--   [5] the token key (RunKeys.claim_token)
-- ARGV: [1] max_count, [2] owner, [3] now_ms, [4] prompt_key_prefix, [5] n, [6] epoch,
--   [7] token_ttl_s
-- Returns: {'fenced'} or {'ok', admitted_total, pid1, attempt1, pid2, attempt2, ...}.
-- Called by: PromptQueue.claim (asyncdapo.services.scheduler.queue), as SCRIPTS["claim"].

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
