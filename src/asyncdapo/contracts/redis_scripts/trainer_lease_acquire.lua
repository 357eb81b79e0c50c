-- trainer_lease_acquire: a starting trainer takes the run's trainer lease (one writing trainer per
-- run). The same id acquires at once (a restart of the same container); while another live trainer
-- holds the lease, the caller waits and retries. Each acquisition increments the trainer epoch and
-- records the id that took it in `trainer:owner`.
-- KEYS: [1] trainer:lease (RunKeys.trainer_lease), [2] trainer:epoch, [3] trainer:owner
-- ARGV: [1] trainer id, [2] lease ms
-- Returns: {1, epoch} (taken) or {0, holder, pttl} (held by another trainer).
-- Called by: TrainerFence.acquire (asyncdapo.services.trainer.fence).

local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return {0, holder, redis.call('PTTL', KEYS[1])}
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[3], ARGV[1])
return {1, epoch}
