-- ragtoll principal charge: add a call's settled cost to the principal's minute and hour buckets.
-- KEYS: 1 cost per minute hash, 2 cost per hour hash. ARGV: 1 now_ms 2 cost_nusd 3 ttl_s
-- Buckets out of their window are dropped here, so each hash holds at most 61 / 25 fields.
local cm, ch = KEYS[1], KEYS[2]
local now, cost, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function add(key, current, width)
  redis.call('HINCRBY', key, current, cost)
  for _, k in ipairs(redis.call('HKEYS', key)) do
    if tonumber(k) <= current - width then redis.call('HDEL', key, k) end
  end
  redis.call('EXPIRE', key, ttl)
end
add(cm, math.floor(now / 60000), 60)
add(ch, math.floor(now / 3600000), 24)
return 1
