-- ragtoll principal admit: is this call's task new to the principal, and does every limit admit it?
-- KEYS (one hash tag per principal): 1 live tasks zset (task -> last call ms), 2 new tasks zset
--   (now:task -> start ms, the last minute), 3 cost per minute hash, 4 cost per hour hash (nano-USD).
-- ARGV: 1 task_id 2 now_ms 3 ttl_s 4 stale_ms 5 shadow(0|1)
--   6 max_new_tasks_per_minute 7 max_concurrent_tasks 8 max_cost_nusd_per_hour 9 max_cost_nusd_per_day
--   (-1 = no limit). Mirrors core/principals.first_exceeded.
-- Returns {'admit'|'reject', dimension or '', new_task(0|1), live, new_in_minute, cost_hour, cost_day}
-- (a cost without a limit is returned as 0: it is not summed)
local live, new, cm, ch = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local task, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', live, '-inf', '(' .. (now - tonumber(ARGV[4])))  -- ends that were never seen
redis.call('ZREMRANGEBYSCORE', new, '-inf', now - 60000)
local is_new = redis.call('ZSCORE', live, task) == false
local function window(key, current, width, limit)
  if tonumber(limit) < 0 then return 0 end  -- no limit: not summed
  local total, flat = 0, redis.call('HGETALL', key)
  for i = 1, #flat, 2 do
    local k = tonumber(flat[i])
    if k > current - width and k <= current then total = total + tonumber(flat[i + 1]) end
  end
  return total
end
local used = {redis.call('ZCARD', new), redis.call('ZCARD', live),
              window(cm, math.floor(now / 60000), 60, ARGV[8]), window(ch, math.floor(now / 3600000), 24, ARGV[9])}
local dims = {'max_new_tasks_per_minute', 'max_concurrent_tasks', 'max_cost_usd_per_hour', 'max_cost_usd_per_day'}
local dim = ''
for i = 1, 4 do
  local limit = tonumber(ARGV[5 + i])
  if limit >= 0 and (i > 2 or is_new) and used[i] >= limit then dim = dims[i]; break end
end
local status = 'admit'
if dim ~= '' and ARGV[5] ~= '1' then
  status = 'reject'
else
  redis.call('ZADD', live, now, task)
  if is_new then redis.call('ZADD', new, now, now .. ':' .. task) end
  redis.call('EXPIRE', live, ttl)
  redis.call('EXPIRE', new, ttl)
end
return {status, dim, is_new and 1 or 0, used[2], used[1], used[3], used[4]}
