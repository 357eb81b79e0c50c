-- trainer_groups_commit: after a durable checkpoint, XACK the groups it covers, then trim the
-- stream to MINID = the oldest entry still pending, or (none) last-delivered-id + 1: nothing
-- unacknowledged is ever trimmed. Credit markers older than MINID go with it (their entries can no
-- longer be delivered).
-- Preludes: trainer_fence_check.lua, trainer_stream_ids.lua (prepended by the loader).
-- KEYS: [1] trainer:lease, [2] trainer:epoch, [3] groups, [4] credited markers
-- ARGV: [1] trainer id, [2] epoch, [3] consumer group, then the entry ids to XACK
-- Returns: {'OK', pending, trimmed, minid} or {'FENCED'}.
-- Called by: GroupsReader (asyncdapo.services.trainer.groups_reader), at start (the ids the last
--   checkpoint covers) and after each durable checkpoint.

for i = 4, #ARGV, 500 do
  redis.call('XACK', KEYS[3], ARGV[3], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
local p = redis.call('XPENDING', KEYS[3], ARGV[3])
local minid
if p[1] > 0 then
  minid = p[2]
else
  local ms, seq = sid(last_delivered(KEYS[3], ARGV[3]))
  minid = string.format('%d-%d', ms, seq + 1)
end
local trimmed = redis.call('XTRIM', KEYS[3], 'MINID', minid)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. sid(minid))
return {'OK', p[1], trimmed, minid}
