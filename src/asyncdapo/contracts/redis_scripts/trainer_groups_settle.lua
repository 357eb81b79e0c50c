-- trainer_groups_settle: XACK entries of the groups stream and credit the dropped ones (groups that
-- will never be trained: 1 to `trainer:dropped:<reason>` and to `valid_credited`, the scheduler's
-- bound), atomically. A dropped entry is credited only when its marker in `trainer:credited`
-- (RunKeys.trainer_credited) is new: a retry after a lost reply or a redelivery credits nothing
-- twice, and a Redis rollback loses the XACK, the credit and the marker together.
-- Preludes: trainer_fence_check.lua (prepended by the loader).
-- KEYS: [1] trainer:lease, [2] trainer:epoch, [3] groups, [4] counters, [5] credited markers
-- ARGV: [1] trainer id, [2] epoch, [3] consumer group, [4] dropped prefix, [5] credited field,
--   [6] redelivered field, [7] redelivered count, then pairs (entry id, drop reason or '' for a
--   plain XACK).
-- Returns: {'OK', acked, credited} or {'FENCED'}.
-- Called by: GroupsReader (asyncdapo.services.trainer.groups_reader), settling redelivered entries
--   and dropping groups.

local acked, credited = 0, 0
for i = 8, #ARGV, 2 do
  acked = acked + redis.call('XACK', KEYS[3], ARGV[3], ARGV[i])
  if ARGV[i + 1] ~= '' then
    local ms = string.match(ARGV[i], '^(%d+)-')
    if redis.call('ZADD', KEYS[5], 'NX', ms, ARGV[i]) == 1 then
      redis.call('HINCRBY', KEYS[4], ARGV[4] .. ARGV[i + 1], 1)
      credited = credited + 1
    end
  end
end
if credited > 0 then redis.call('HINCRBY', KEYS[4], ARGV[5], credited) end
if tonumber(ARGV[7]) > 0 then redis.call('HINCRBY', KEYS[4], ARGV[6], ARGV[7]) end
return {'OK', acked, credited}
