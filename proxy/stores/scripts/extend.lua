-- ragtoll budget extend: add output tokens (and their cost) to one reservation in flight, as much
-- as the task has left under its completion-token and cost limits. Mirrors core.hold.grant_extension.
-- KEYS: 1 task hash, 2 reservations in flight (see reserve.lua). Both share the task's hash tag.
-- ARGV: 1 reservation id 2 tokens asked 3 their cost (nano-USD) 4 max_completion_tokens
--       5 max_cost (nano-USD; -1 = unlimited) 6 now_ms 7 new expiry (ms) 8 ttl_s
-- Returns {granted tokens, granted cost}: {0, 0} when nothing is left, or the reservation is
-- settled, cancelled or gone.
local h, r = KEYS[1], KEYS[2]
local rid = ARGV[1]
local rec = redis.call('HGET', r, rid)
local tokens, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
if not rec or string.sub(rec, 1, 2) ~= 'r ' or tokens <= 0 then return {0, 0} end
local u = redis.call('HMGET', h, 'completion_tokens', 'cost_nusd', 'last_ms')
local used_comp, used_cost = tonumber(u[1] or '0'), tonumber(u[2] or '0')
local granted = tokens
local lim_comp, lim_cost = tonumber(ARGV[4]), tonumber(ARGV[5])
if lim_comp >= 0 then granted = math.min(granted, lim_comp - used_comp) end
if lim_cost >= 0 and cost > 0 then granted = math.min(granted, math.floor((lim_cost - used_cost) * tokens / cost)) end
if granted <= 0 then return {0, 0} end
local gcost = cost
if granted < tokens then gcost = math.floor(cost * granted / tokens) end
redis.call('HINCRBY', h, 'completion_tokens', granted)
if gcost ~= 0 then redis.call('HINCRBY', h, 'cost_nusd', gcost) end
redis.call('HINCRBY', h, 'held_completion_tokens', granted)
if gcost ~= 0 then redis.call('HINCRBY', h, 'held_cost_nusd', gcost) end
local f = {}
for n in string.gmatch(rec, '%-?%d+') do f[#f + 1] = n end
-- 1 expires 2 steps 3 calls 4 retrieval 5 rerank 6 context 7 completion 8 cost 9 new_query 10 hit
f[1] = ARGV[7]
f[7] = string.format('%d', tonumber(f[7]) + granted)
f[8] = string.format('%d', tonumber(f[8]) + gcost)
redis.call('HSET', r, rid, 'r ' .. table.concat(f, ' '))
local now = tonumber(ARGV[6])
if now > tonumber(u[3] or '0') then redis.call('HSET', h, 'last_ms', now) end
local ttl = tonumber(ARGV[8])
redis.call('EXPIRE', h, ttl)
redis.call('EXPIRE', r, ttl)
return {granted, gcost}
