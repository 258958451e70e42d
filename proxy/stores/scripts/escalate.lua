-- ragtoll budget escalate: move a task to a larger profile, once, if it still runs under `from`,
-- and undo the refusal that asked for it (one rejection of `dimension`, and the task's exhausted
-- mark if that refusal set it), so the call can be judged again under the new profile.
-- Only a task whose last retrieval was fruitful evidence for its question climbs (settle.lua's 'e').
-- KEYS: 1 task hash. ARGV: 1 from profile 2 to profile 3 the refusing dimension.
-- Returns 1 when the task moved, 0 when it is gone, runs under another profile, has climbed before
-- or its last retrieval was not evidence for its question.
local h = KEYS[1]
if redis.call('HGET', h, 'profile') ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', h, 'escalated') or '0') > 0 then return 0 end
if tonumber(redis.call('HGET', h, 'last_evidence') or '0') ~= 1 then return 0 end
redis.call('HSET', h, 'profile', ARGV[2])
redis.call('HINCRBY', h, 'escalated', 1)
local rej = 'rej:' .. ARGV[3]
if redis.call('HINCRBY', h, rej, -1) <= 0 then
  redis.call('HDEL', h, rej)
  if redis.call('HGET', h, 'exhausted') == ARGV[3] then redis.call('HDEL', h, 'exhausted') end
end
return 1
