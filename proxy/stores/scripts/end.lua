-- ragtoll end task: read and delete a task's keys, once. With an idle cutoff, only an idle task ends:
-- no call since the cutoff, and every reservation in flight expired before it.
-- KEYS: 1 task hash, 2 unique-query set, 3 chunk set, 4 reservations in flight (see reserve.lua).
-- ARGV: 1 idle_before_ms (-1: end unconditionally)
-- Returns {'missing'} | {'active', last_ms} | {'ended', HGETALL...}
local h, q, c, r = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if redis.call('EXISTS', h) == 0 then
  redis.call('DEL', r)  -- tombstones of a task that never started
  return {'missing'}
end
local cutoff = tonumber(ARGV[1])
if cutoff >= 0 then
  local last = tonumber(redis.call('HGET', h, 'last_ms') or '0')
  if last >= cutoff then return {'active', tostring(last)} end
  for _, rec in ipairs(redis.call('HVALS', r)) do
    if string.sub(rec, 1, 2) == 'r ' and tonumber(string.match(rec, '%d+')) >= cutoff then
      return {'active', tostring(last)}
    end
  end
end
local out = {'ended'}
for _, v in ipairs(redis.call('HGETALL', h)) do out[#out + 1] = v end
redis.call('DEL', h, q, c, r)
return out
