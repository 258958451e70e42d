-- ragtoll budget settle: replace a call's reservation with its actual use, track evidence novelty.
-- KEYS: 1 task hash, 2 chunk set, 3 unique-query set (TTL only), 4 reservations in flight.
-- ARGV: 1 now_ms 2 ttl_s 3 d_context 4 d_completion 5 d_cost (deltas for a reservation without an id)
--       6 chunks: 0 none | 1 fruitful if any chunk is new | f fruitful | x fruitless (a progress verdict)
--         | e fruitful evidence for the task's question (what lets it climb: escalate.lua)
--       7 reservation id ('' = none) 8 context 9 completion 10 cost (actual use)
--       11 finished by ragtoll (0|1: on_exhausted: finish rewrote the call) 12 cached input tokens
--       13 cache write tokens (an LLM call's, as the upstream reported them)
--       14 the call's context-economy counts, 'name n name n ...' ('' = none; core/tally.py)
--       15.. chunk ids
-- Returns false when the task is gone (ended meanwhile), else HGETALL of the task hash (unchanged
-- when the reservation is no longer in flight: settled already, or cancelled).
local h, c, q, r = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if redis.call('EXISTS', h) == 0 then return false end
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local rid = ARGV[7]
local d_ctx, d_comp, d_cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if rid ~= '' then
  local rec = redis.call('HGET', r, rid)
  if not rec or string.sub(rec, 1, 2) ~= 'r ' then return redis.call('HGETALL', h) end
  local f = {}
  for n in string.gmatch(rec, '%-?%d+') do f[#f + 1] = tonumber(n) end
  -- 1 expires 2 steps 3 calls 4 retrieval 5 rerank 6 context 7 completion 8 cost 9 new_query 10 hit
  d_ctx, d_comp, d_cost = tonumber(ARGV[8]) - f[6], tonumber(ARGV[9]) - f[7], tonumber(ARGV[10]) - f[8]
  redis.call('HDEL', r, rid, rid .. '#q')
  for i, held in ipairs({'held_context_tokens', 'held_completion_tokens', 'held_cost_nusd'}) do
    if f[i + 5] ~= 0 and tonumber(redis.call('HINCRBY', h, held, -f[i + 5])) < 0 then redis.call('HSET', h, held, 0) end
  end
end
local deltas = {{'context_tokens', d_ctx}, {'completion_tokens', d_comp}, {'cost_nusd', d_cost}, {'inflight', -1},
                {'finished', tonumber(ARGV[11])}, {'cached_input_tokens', tonumber(ARGV[12])},
                {'cache_write_tokens', tonumber(ARGV[13])}}
for name, n in string.gmatch(ARGV[14], '(%S+) (%-?%d+)') do deltas[#deltas + 1] = {name, tonumber(n)} end
for _, d in ipairs(deltas) do
  if d[2] ~= 0 then redis.call('HINCRBY', h, d[1], d[2]) end
end
if tonumber(redis.call('HGET', h, 'inflight') or '0') < 0 then redis.call('HSET', h, 'inflight', 0) end
if ARGV[6] ~= '0' then
  local added = 0
  local n = #ARGV
  local i = 15
  while i <= n do  -- SADD in batches: Lua's unpack has a stack limit
    local j = math.min(i + 999, n)
    added = added + redis.call('SADD', c, unpack(ARGV, i, j))
    i = j + 1
  end
  redis.call('HSET', h, 'last_new', added)  -- this call's novelty, for x-ragtoll-evidence
  local fruitful = ARGV[6] == 'f' or ARGV[6] == 'e' or (ARGV[6] == '1' and added > 0)
  if ARGV[6] == 'e' then
    redis.call('HINCRBY', h, 'evidence', 1)
    redis.call('HSET', h, 'last_evidence', 1)
  else
    redis.call('HDEL', h, 'last_evidence')
  end
  if fruitful then
    redis.call('HSET', h, 'stalled', 0)
  else
    redis.call('HINCRBY', h, 'stalled', 1)
    redis.call('HINCRBY', h, 'fruitless', 1)
  end
  redis.call('HSET', h, 'chunks_seen', redis.call('SCARD', c))
end
local last = tonumber(redis.call('HGET', h, 'last_ms') or '0')
if now > last then redis.call('HSET', h, 'last_ms', now) end
redis.call('EXPIRE', h, ttl)
redis.call('EXPIRE', c, ttl)
redis.call('EXPIRE', q, ttl)
return redis.call('HGETALL', h)
