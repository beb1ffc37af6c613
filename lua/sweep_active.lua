#!lua
--[[
stockgate's sweep index: tells the sweep leader (lua/sweep_lease.lua) that
one shard has holds to watch, for ARGV[2] milliseconds from now (Redis
time) at least. Sent with a HOLD, at most every few seconds per shard by
each stockgate: a hint of where to look, never a decision (the scripts
decide every expiry by Redis time).

KEYS[1]  active   <prefix>:{sweep}:active
ARGV[1]  the shard's number
ARGV[2]  milliseconds

Replies: the time until which the shard is active, ms of Redis time.
]]

--@common

local function sweep_active(KEYS, ARGV)
  if not call then
    bind()
  end
  local until_at = now_ms() + to_number(ARGV[2])
  call('ZADD', KEYS[1], 'GT', until_at, ARGV[1])
  return to_number(call('ZSCORE', KEYS[1], ARGV[1]))
end

return sweep_active(KEYS, ARGV)
