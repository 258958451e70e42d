-- ragtoll end task: read and delete a task's keys, once. With an idle cutoff, only an idle task ends.
-- KEYS: 1 task hash, 2 unique-query set, 3 chunk set.
-- ARGV: 1 idle_before_ms (-1: end unconditionally) 2 stale_inflight_ms
-- Returns {'missing'} | {'active', last_ms} | {'ended', HGETALL...}
local h, q, c = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', h) == 0 then return {'missing'} end
local cutoff = tonumber(ARGV[1])
if cutoff >= 0 then
  local last = tonumber(redis.call('HGET', h, 'last_ms') or '0')
  local inflight = tonumber(redis.call('HGET', h, 'inflight') or '0')
  if last >= cutoff or (inflight > 0 and last >= cutoff - tonumber(ARGV[2])) then
    return {'active', tostring(last)}
  end
end
local out = {'ended'}
for _, v in ipairs(redis.call('HGETALL', h)) do out[#out + 1] = v end
redis.call('DEL', h, q, c)
return out
