-- scheduler_count: write the counters a scheduler keeps in memory (aborts, early stops) as a batch
-- of increments, once per sequence number: a retry after a lost reply is a no-op.
-- KEYS: [1] counters, [2] the caller's sequence key (RunKeys.count_seq)
-- ARGV: [1] seq, [2] ttl_s (how long the sequence number is remembered), then field, delta pairs
-- Returns: 1 (applied) or 0 (this sequence number was applied before).
-- Called by: Housekeeper.flush_counters (asyncdapo.services.scheduler.housekeeping), as SCRIPTS["count"].

local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
