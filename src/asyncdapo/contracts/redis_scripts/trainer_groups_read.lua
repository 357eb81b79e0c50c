-- trainer_groups_read: one fenced XREADGROUP of the run's groups stream (a fenced-out trainer reads
-- nothing more: nothing it reads could get stuck as its pending entry).
-- Preludes: trainer_fence_check.lua, trainer_stream_ids.lua (prepended by the loader).
-- KEYS: [1] trainer:lease, [2] trainer:epoch, [3] groups (RunKeys.groups)
-- ARGV: [1] trainer id, [2] epoch, [3] consumer group, [4] consumer, [5] count,
--   [6] start ('>' or an id)
-- Returns: {'OK', last-delivered-id (when '>' read nothing, else ''), entries | nil} or {'FENCED'}.
-- Called by: GroupsReader (asyncdapo.services.trainer.groups_reader), reading new or pending entries.

local r = redis.call('XREADGROUP', 'GROUP', ARGV[3], ARGV[4], 'COUNT', ARGV[5], 'STREAMS', KEYS[3], ARGV[6])
if r and #r[1][2] > 0 then return {'OK', '', r[1][2]} end
if ARGV[6] == '>' then return {'OK', last_delivered(KEYS[3], ARGV[3])} end
return {'OK', ''}
