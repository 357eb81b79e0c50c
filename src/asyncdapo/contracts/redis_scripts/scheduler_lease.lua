-- scheduler_lease: the owning scheduler refreshes its lease (every second, housekeeping).
-- KEYS: [1] scheduler:epoch, [2] scheduler:lease
-- ARGV: [1] owner, [2] epoch, [3] lease_ms
-- Returns: 1 (lease refreshed), 0 (fenced: another scheduler took over), -1 (the epoch is gone:
--   Redis lost the run's state; the caller takes over again).
-- Called by: PromptQueue.refresh_lease (asyncdapo.services.scheduler.queue), as SCRIPTS["lease"].

local cur = redis.call('GET', KEYS[1])
if not cur then return -1 end
if cur ~= ARGV[2] then return 0 end
local mine = ARGV[1] .. '|' .. ARGV[2]
-- A lease still ours is extended with PEXPIRE, which Redis allows at maxmemory (SET is refused
-- there): a full Redis must not cost the owner its lease and strand its claims. An expired one is set.
if redis.call('GET', KEYS[2]) == mine then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
else
  redis.call('SET', KEYS[2], mine, 'PX', ARGV[3])
end
return 1
