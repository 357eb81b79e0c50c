-- scheduler_lease: the owning scheduler refreshes its lease (every second, housekeeping).
-- KEYS: [1] scheduler:epoch, [2] scheduler:lease
-- ARGV: [1] owner, [2] epoch, [3] lease_ms
-- Returns: 1 (lease refreshed), 0 (fenced: another scheduler took over), -1 (the epoch is gone:
--   Redis lost the run's state; the caller takes over again).
-- Called by: PromptQueue.refresh_lease (asyncdapo.services.scheduler.queue), as SCRIPTS["lease"].

local cur = redis.call('GET', KEYS[1])
if not cur then return -1 end
if cur ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[2], ARGV[1] .. '|' .. ARGV[2], 'PX', ARGV[3])
return 1
