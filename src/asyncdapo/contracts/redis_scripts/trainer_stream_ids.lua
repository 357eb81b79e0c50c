-- trainer_stream_ids (a prelude, never run alone): Lua functions on stream ids for the
-- trainer_groups_* scripts that need them: sid(id) -> ms, seq; newer(a, b) -> a > b;
-- last_delivered(stream, group) -> the consumer group's last-delivered id ('0-0' if none).
-- Prepended by: asyncdapo.contracts.redis_scripts (PRELUDES), after trainer_fence_check.

local function sid(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function newer(a, b)
  local am, as = sid(a)
  local bm, bs = sid(b)
  return am > bm or (am == bm and as > bs)
end
local function last_delivered(stream, group)
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, last = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
    end
    if name == group then return last end
  end
  return '0-0'
end
