-- ragtoll budget reserve: check every dimension and charge one call, atomically, in one round trip.
-- Mirrors budget.first_exceeded / apply_charge (the memory store); keep the two in step.
-- KEYS: 1 task hash, 2 unique-query set, 3 chunk set (TTL only), 4 reservations in flight (hash:
--       id -> 'r <expires_ms> <steps> <calls> <retrieval> <rerank> <context> <completion> <cost>
--       <new_query> <cache_hit>', id#q -> 'q <the query key it added>', id -> 'x': cancelled before it came).
--       All share the task's hash tag.
-- ARGV: 1 task_id 2 profile 3 class 4 route 5 now_ms 6 ttl_s 7 shadow(0|1) 8 query_key ('' = none)
--       9 steps 10 calls 11 retrieval_calls 12 rerank_calls 13 context_tokens 14 prompt_tokens
--       15 completion_reserve 16 cost_certain 17 cost_reserve 18 cache_hit(0|1)
--       19..30 limits in DIMENSIONS order (-1 = unlimited) 31 task source 32 trace id (hex)
--       33 seen cap: > 0 asks for the task's chunk ids when there are at most that many
--       34 reservation id 35 its expiry (ms) 36 choices (answers asked for: one output token each at least)
-- Returns {'cancelled'} | {'duplicate'} | {'conflict', stored_profile} | {'reject', dimension|'', 0, HGETALL...}
--       | {'ok', dimension|'', new_query(0|1), granted output tokens, their cost, n (-1: not returned),
--          n chunk ids..., HGETALL...}
-- An admitted LLM call is reserved as much of its output as the task has left (budget.granted_output).
local h, q, c, r = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid = ARGV[34]
local prior = redis.call('HGET', r, rid)
if prior == 'x' then  -- its caller gave up on it (cancel came first)
  redis.call('HDEL', r, rid)
  return {'cancelled'}
elseif prior then  -- sent twice (a client retry after a lost reply): never charge twice
  return {'duplicate'}
end
local now = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local shadow = ARGV[7] == '1'
local qk = ARGV[8]

local profile = redis.call('HGET', h, 'profile')
if not profile then
  redis.call('HSET', h, 'task_id', ARGV[1], 'profile', ARGV[2], 'class', ARGV[3], 'route', ARGV[4],
             'started_ms', now, 'source', ARGV[31], 'trace_id', ARGV[32])
elseif profile ~= ARGV[2] then
  return {'conflict', profile}
end
redis.call('HSET', h, 'last_ms', now)

local u = redis.call('HMGET', h, 'steps', 'calls', 'retrieval_calls', 'unique_queries', 'rerank_calls',
                     'context_tokens', 'completion_tokens', 'cost_nusd', 'stalled', 'started_ms', 'fruitless')
for i = 1, 11 do u[i] = tonumber(u[i] or '0') end
local steps, calls, retr, rer = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local ctx, prompt, comp = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local cost_certain, cost_reserve = tonumber(ARGV[16]), tonumber(ARGV[17])
local cost = cost_certain + cost_reserve
local choices = tonumber(ARGV[36] or '1')
-- output tokens `left` nano-USD pay for at this call's output price (budget._output_by_cost)
local function by_cost(left) if left <= 0 then return 0 end; return math.floor(left * comp / cost_reserve) end

local newq = 0
if qk ~= '' and redis.call('SISMEMBER', q, qk) == 0 then newq = 1 end

local function lim(i) local v = tonumber(ARGV[18 + i]); if v < 0 then return nil end; return v end
local function over(i, bad) return lim(i) ~= nil and bad(lim(i)) end
local dims = {'max_steps', 'max_calls', 'max_retrieval_calls', 'max_unique_queries', 'max_rerank_calls',
              'max_context_tokens', 'max_prompt_tokens', 'max_completion_tokens', 'max_cost_usd',
              'max_latency_ms', 'max_stalled_retrievals', 'max_fruitless_retrievals'}
local checks = {
  function(l) return steps > 0 and u[1] + steps > l end,
  function(l) return calls > 0 and u[2] + calls > l end,
  function(l) return retr > 0 and u[3] + retr > l end,
  function(l) return newq == 1 and u[4] + 1 > l end,
  function(l) return rer > 0 and u[5] + rer > l end,
  function(l) return ctx > 0 and u[6] + ctx > l end,
  function(l) return prompt > l end,
  function(l) return comp > 0 and l - u[7] < choices end,
  function(l) return cost > 0 and (u[8] + cost_certain > l or u[8] >= l
                                   or (cost_reserve > 0 and by_cost(l - u[8] - cost_certain) < choices)) end,
  function(l) return u[10] > 0 and now - u[10] >= l end,
  function(l) return retr > 0 and u[9] >= l end,
  function(l) return retr > 0 and u[11] >= l end,
}
local dim = ''
for i = 1, 12 do
  if over(i, checks[i]) then dim = dims[i]; break end
end

local function expire_all()
  redis.call('EXPIRE', h, ttl)
  redis.call('EXPIRE', q, ttl)
  redis.call('EXPIRE', c, ttl)
  redis.call('EXPIRE', r, ttl)
end

if dim ~= '' and not shadow then
  redis.call('HINCRBY', h, 'rej:' .. dim, 1)
  redis.call('HSETNX', h, 'exhausted', dim)
  expire_all()
  local out = {'reject', dim, 0}
  for _, v in ipairs(redis.call('HGETALL', h)) do out[#out + 1] = v end
  return out
end
if dim ~= '' then redis.call('HINCRBY', h, 'srej:' .. dim, 1) end

-- worst-case admission: the output reserved is what the task has left, at most what was asked
local g_comp, g_cost = comp, cost_reserve
if comp > 0 and not shadow then
  local g = comp
  if lim(8) ~= nil then g = math.min(g, lim(8) - u[7]) end
  if lim(9) ~= nil and cost_reserve > 0 then g = math.min(g, by_cost(lim(9) - u[8] - cost_certain)) end
  if g < comp then
    if g < 0 then g = 0 end
    g_comp = math.floor(g / choices) * choices
    g_cost = math.floor(cost_reserve * g_comp / comp)
  end
end
local held = cost_certain + g_cost

local adds = {{'steps', steps}, {'calls', calls}, {'retrieval_calls', retr}, {'rerank_calls', rer},
              {'context_tokens', ctx}, {'completion_tokens', g_comp}, {'cost_nusd', held}, {'inflight', 1},
              -- what this reservation holds of the totals until its settle (budget.HELD)
              {'held_context_tokens', ctx}, {'held_completion_tokens', g_comp}, {'held_cost_nusd', held}}
if ARGV[18] == '1' then adds[#adds + 1] = {'cache_hits', 1} end
for _, a in ipairs(adds) do
  if a[2] ~= 0 then redis.call('HINCRBY', h, a[1], a[2]) end
end
if newq == 1 then
  redis.call('SADD', q, qk)
  redis.call('HINCRBY', h, 'unique_queries', 1)
  redis.call('HSET', r, rid .. '#q', 'q ' .. qk)
end
redis.call('HSET', r, rid, string.format('r %d %d %d %d %d %d %d %d %d %d', tonumber(ARGV[35]), steps, calls, retr,
                                         rer, ctx, g_comp, held, newq, tonumber(ARGV[18])))
expire_all()
local out = {'ok', dim, newq, g_comp, g_cost, -1}
local cap = tonumber(ARGV[33] or '0')
if cap > 0 then  -- a retrieval: the evidence the task had when admitted (x-ragtoll-evidence's `new`)
  local n = redis.call('SCARD', c)
  if n <= cap then
    out[6] = n
    for _, m in ipairs(redis.call('SMEMBERS', c)) do out[#out + 1] = m end
  end
end
for _, v in ipairs(redis.call('HGETALL', h)) do out[#out + 1] = v end
return out
