-- ragtoll budget cancel: undo a reservation whose caller never learned the reserve's outcome (a
-- store timeout: the call was not admitted), or make sure its reserve charges nothing when it comes.
-- KEYS: 1 task hash, 2 unique-query set, 3 reservations in flight (see reserve.lua).
-- ARGV: 1 reservation id 2 ttl_s
-- Returns 1 when a reservation was undone, else 0 (idempotent).
local h, q, r = KEYS[1], KEYS[2], KEYS[3]
local rid, ttl = ARGV[1], tonumber(ARGV[2])
local rec = redis.call('HGET', r, rid)
if not rec then  -- not arrived yet (or settled long ago: a harmless tombstone until the task ends)
  redis.call('HSET', r, rid, 'x')
  redis.call('EXPIRE', r, ttl)
  return 0
end
if string.sub(rec, 1, 2) ~= 'r ' then return 0 end
local f = {}
for n in string.gmatch(rec, '%-?%d+') do f[#f + 1] = tonumber(n) end
-- 1 expires 2 steps 3 calls 4 retrieval 5 rerank 6 context 7 completion 8 cost 9 new_query 10 hit
local names = {'steps', 'calls', 'retrieval_calls', 'rerank_calls', 'context_tokens', 'completion_tokens',
               'cost_nusd', 'unique_queries', 'cache_hits'}
for i, name in ipairs(names) do
  if f[i + 1] ~= 0 then redis.call('HINCRBY', h, name, -f[i + 1]) end
end
for i, held in ipairs({'held_context_tokens', 'held_completion_tokens', 'held_cost_nusd'}) do
  if f[i + 5] ~= 0 and tonumber(redis.call('HINCRBY', h, held, -f[i + 5])) < 0 then redis.call('HSET', h, held, 0) end
end
if f[9] == 1 then
  local qk = redis.call('HGET', r, rid .. '#q')
  if qk then redis.call('SREM', q, string.sub(qk, 3)) end
end
redis.call('HINCRBY', h, 'inflight', -1)
if tonumber(redis.call('HGET', h, 'inflight') or '0') < 0 then redis.call('HSET', h, 'inflight', 0) end
redis.call('HDEL', r, rid, rid .. '#q')
return 1
