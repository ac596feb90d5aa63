-- rl's Lua baseline: the rate limiter users run today instead of RL.TAKE.
--
-- A cost-weighted token bucket with strikes and an escalating penalty box,
-- loaded once with SCRIPT LOAD and called with EVALSHA on every request.
-- It is written the way such scripts usually are (floating-point tokens in
-- a hash, one plain key per piece of penalty state), so that the system
-- benchmark (bench/run.sh) can compare RL.TAKE with it in the same server.
--
-- KEYS[1]  bucket    hash {t = tokens left, ts = last update, ms}, PEXPIRE
--                    at the time it takes to refill from empty
-- KEYS[2]  box       string: the box level; its TTL is the box (no TTL:
--                    a manual box)
-- KEYS[3]  strikes   counter, expires `window` s after the first strike
-- KEYS[4]  offenses  counter, expires `offenses_ttl` s after the last trip
--
-- ARGV, in RL.TAKE's order:
--   capacity tokens period_s cost threshold window_s d1_s d2_s d3_s offenses_ttl_s
--
-- Reply: RL.TAKE's 8 integers {status (1 allowed, 0 throttled, -1 boxed),
-- limit, remaining, reset_ms, retry_after_ms, box_level, strikes_remaining,
-- binding (always 0)}. As in typical scripts, an allowed reply does not
-- read the strike counter: it reports `threshold` strikes remaining.

local capacity  = tonumber(ARGV[1])
local per_ms    = tonumber(ARGV[2]) / (tonumber(ARGV[3]) * 1000)
local cost      = tonumber(ARGV[4])
local threshold = tonumber(ARGV[5])

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- An active box answers at once (PTTL: -2 no key, -1 a manual box).
local box_left = redis.call('PTTL', KEYS[2])
if box_left ~= -2 then
  local level = tonumber(redis.call('GET', KEYS[2])) or 1
  return {-1, capacity, 0, box_left, box_left, level, 0, 0}
end

-- Refill since the last update, never above capacity.
local points = capacity
local saved = redis.call('HMGET', KEYS[1], 't', 'ts')
if saved[1] then
  local since = now - tonumber(saved[2])
  if since < 0 then since = 0 end
  points = math.min(capacity, tonumber(saved[1]) + since * per_ms)
end
local refill_ms = math.ceil(capacity / per_ms)

if points >= cost then
  points = points - cost
  redis.call('HSET', KEYS[1], 't', points, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], refill_ms)
  local reset_ms = math.ceil((capacity - points) / per_ms)
  return {1, capacity, math.floor(points), reset_ms, 0, 0, threshold, 0}
end

-- Throttled: store the refilled level, count a strike, maybe trip the box.
redis.call('HSET', KEYS[1], 't', points, 'ts', now)
redis.call('PEXPIRE', KEYS[1], refill_ms)
local strikes = redis.call('INCR', KEYS[3])
if strikes == 1 then
  redis.call('EXPIRE', KEYS[3], ARGV[6])
end
if strikes < threshold then
  local wait_ms = math.ceil((cost - points) / per_ms)
  local reset_ms = math.ceil((capacity - points) / per_ms)
  return {0, capacity, math.floor(points), reset_ms, wait_ms, 0, threshold - strikes, 0}
end

local offenses = redis.call('INCR', KEYS[4])
redis.call('EXPIRE', KEYS[4], ARGV[10])
redis.call('DEL', KEYS[3])
local level = math.min(offenses, 3)
local box_s = tonumber(ARGV[6 + level])
if box_s > 0 then
  redis.call('SET', KEYS[2], level, 'PX', math.floor(box_s * 1000))
  return {-1, capacity, 0, box_s * 1000, box_s * 1000, level, 0, 0}
end
redis.call('SET', KEYS[2], level)
return {-1, capacity, 0, -1, -1, level, 0, 0}
