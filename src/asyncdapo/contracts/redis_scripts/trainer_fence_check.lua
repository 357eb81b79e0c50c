-- trainer_fence_check (a prelude, never run alone): the prefix of every script that writes on the
-- trainer's behalf (the trainer_groups_* scripts): it stops the script unless the caller still
-- holds the trainer lease at its epoch, atomically with the script's writes.
-- KEYS: [1] trainer:lease, [2] trainer:epoch (the script's own keys follow)
-- ARGV: [1] trainer id, [2] epoch ('' id: unfenced, for tools and tests; the script's own
--   arguments follow)
-- Returns: {'FENCED'} when the caller was fenced out; otherwise falls through to the script.
-- Prepended by: asyncdapo.contracts.redis_scripts (PRELUDES); FENCE_LUA of
--   asyncdapo.services.trainer.fence, whose TrainerFence.run_fenced handles the {'FENCED'} reply.

if ARGV[1] ~= '' and (redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[2]) then
  return {'FENCED'}
end
