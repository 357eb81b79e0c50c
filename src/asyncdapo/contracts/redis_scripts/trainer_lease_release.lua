-- trainer_lease_release: a trainer that ends gracefully gives its lease up, so a successor need not
-- wait for it to expire; only if the lease and the epoch are still its own.
-- KEYS: [1] trainer:lease, [2] trainer:epoch
-- ARGV: [1] trainer id, [2] epoch
-- Returns: 1 released | 0 not ours.
-- Called by: TrainerFence.release (asyncdapo.services.trainer.fence).

if redis.call('GET', KEYS[1]) == ARGV[1] and redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
