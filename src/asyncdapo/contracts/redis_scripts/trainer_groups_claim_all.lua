-- trainer_groups_claim_all: at start (and after any Redis error) the trainer takes over every
-- pending entry of the groups stream for `consumer` (XAUTOCLAIM, whatever consumer read it), to
-- replay them oldest first. Entries whose data is gone (XAUTOCLAIM removes them from the pending
-- list) are credited (`dropped:missing` and `valid_credited`) when newer than the newest processed
-- id (never processed) and not credited yet (their marker in `trainer:credited` is new).
-- Preludes: trainer_fence_check.lua, trainer_stream_ids.lua (prepended by the loader).
-- KEYS: [1] trainer:lease, [2] trainer:epoch, [3] groups, [4] counters, [5] credited markers
-- ARGV: [1] trainer id, [2] epoch, [3] consumer group, [4] consumer, [5] newest processed id,
--   [6] dropped:missing field, [7] credited field
-- Returns: {'OK', claimed, missing} or {'FENCED'}.
-- Called by: GroupsReader (asyncdapo.services.trainer.groups_reader), taking over pending entries.

local start, claimed, missing = '0-0', 0, 0
repeat
  local r = redis.call('XAUTOCLAIM', KEYS[3], ARGV[3], ARGV[4], 0, start, 'COUNT', 256, 'JUSTID')
  start = r[1]
  claimed = claimed + #r[2]
  if r[3] then
    for _, id in ipairs(r[3]) do
      if newer(id, ARGV[5]) and redis.call('ZADD', KEYS[5], 'NX', sid(id), id) == 1 then
        missing = missing + 1
      end
    end
  end
until start == '0-0'
if missing > 0 then
  redis.call('HINCRBY', KEYS[4], ARGV[6], missing)
  redis.call('HINCRBY', KEYS[4], ARGV[7], missing)
end
return {'OK', claimed, missing}
