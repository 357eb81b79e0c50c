-- trainer_lease_renew: the trainer checks, in one round trip, that the lease is its own and the
-- epoch unchanged, and renews the lease. After a Redis outage longer than the lease the key has
-- expired: the trainer that owns the current epoch (`trainer:owner`) re-takes it without a new
-- epoch, unless another trainer acquired it first.
-- KEYS: [1] trainer:lease, [2] trainer:epoch, [3] trainer:owner
-- ARGV: [1] trainer id, [2] epoch, [3] lease ms
-- Returns: {1} renewed | {2} re-taken after expiry | {0, holder, epoch} fenced.
-- Called by: TrainerFence.check and its heartbeat thread (asyncdapo.services.trainer.fence).

local holder = redis.call('GET', KEYS[1])
local epoch = redis.call('GET', KEYS[2])
if epoch == ARGV[2] then
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {1}
  end
  if not holder and redis.call('GET', KEYS[3]) == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
    return {2}
  end
end
return {0, holder or '', epoch or ''}
