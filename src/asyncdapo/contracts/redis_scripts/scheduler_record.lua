-- scheduler_record: count a batch of scored responses into their prompts' group state (Welford
-- accumulators of the filter metric `mean`/`m2` and of the reward `rmean`/`rm2`, the token version
-- range `vmin`/`vmax`) and the run's completion counters; one atomic step per response, one call
-- per scored batch. Idempotent: a response is counted once (`r:{attempt}:{idx}` markers); a retry
-- answers `dup`. A response of an attempt that is no longer current or already has its outcome
-- answers `stale`; a caller whose epoch is not the current one changes nothing (`fenced`).
-- KEYS: [1] counters, [2] scheduler:epoch, then the prompt key (RunKeys.prompt) of each response.
-- ARGV: [1] epoch, then per response one string "attempt idx metric reward vmin vmax length"
--   (one argument, not seven: the client's command packing costs per argument, and this script
--   runs once per scored batch of up to 64 responses).
-- Returns: one reply per response: {status, done, n[, mean, std, rmean, rstd, vmin, vmax]}, status
--   ok|complete|dup|stale|fenced; the statistics only when the group is complete or the response a
--   duplicate (small replies for the common case). `completions` and `generated_tokens` count the
--   responses counted here for the first time (never a retry's). Floats are returned as strings:
--   Redis truncates Lua numbers to integers in replies.
-- Called by: GroupStore.record (asyncdapo.services.scheduler.group_state), as SCRIPTS["record"].

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
