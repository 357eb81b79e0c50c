-- scheduler_takeover: a scheduler takes the run over. Fencing: one scheduler owns a run at a time;
-- each takeover increments the run's epoch, and every script that changes the queue or an outcome
-- (scheduler_claim, scheduler_record, scheduler_finish) first checks that the caller's epoch is
-- still the current one. A scheduler that was replaced can therefore never write over its
-- successor, however late its calls arrive.
-- KEYS: [1] scheduler:epoch (RunKeys.scheduler_epoch), [2] scheduler:lease (RunKeys.scheduler_lease)
-- ARGV: [1] owner, [2] lease_ms
-- Returns: the new epoch (the lease is set to `owner|epoch`, PX lease_ms).
-- Called by: PromptQueue.take_over (asyncdapo.services.scheduler.queue), as SCRIPTS["takeover"].

local e = redis.call('INCR', KEYS[1])
redis.call('SET', KEYS[2], ARGV[1] .. '|' .. e, 'PX', ARGV[2])
return e
