-- scheduler_release: a scheduler that stops gives its lease up, so a successor need not wait for
-- it to expire. Deletes the lease only if it is still ours.
-- KEYS: [1] scheduler:lease
-- ARGV: [1] owner|epoch
-- Returns: 1 (deleted) or 0 (not ours, or already gone).
-- Called by: PromptQueue.release_lease (asyncdapo.services.scheduler.queue), as SCRIPTS["release"].

if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
