#!lua
--[[
stockgate's sweep lease: one stockgate leads the sweep at a time. Takes the
lease when it is free, renews it when the caller holds it, and gives it up
when ARGV[2] is 0. Sweeping twice is harmless (a release is idempotent);
the lease only keeps the cost of looking for other stockgates' holds from
growing with the fleet. The leader also learns here which shards of the
sweep index have holds to watch (lua/sweep_active.lua wrote them); an idle
cluster costs it this one call (four commands) per look.

KEYS[1]  lease    <prefix>:{sweep}:lease    the leader's id, with a TTL
KEYS[2]  active   <prefix>:{sweep}:active   sorted set: shard by the time
                                            (ms of Redis time) until which
                                            it may hold holds to release
ARGV[1]  the caller's id
ARGV[2]  how long the lease lasts, milliseconds (0: give it up)

Replies: {1, shard, shard, ...} when the caller holds the lease now (the
shards still active), else {0}.
]]

--@common

local function sweep_lease(KEYS, ARGV)
  if not call then
    bind()
  end
  local lease_key, active_key = KEYS[1], KEYS[2]
  local owner, ms = ARGV[1], to_number(ARGV[2])
  local holder = call('GET', lease_key)
  if ms == 0 then
    if holder == owner then
      call('DEL', lease_key)
    end
    return {0}
  end
  if holder and holder ~= owner then
    return {0}
  end
  if holder then
    call('PEXPIRE', lease_key, ms)
  else
    call('SET', lease_key, owner, 'PX', ms)
  end
  local reply = {1}
  local active = call('ZRANGE', active_key, 0, -1, 'WITHSCORES')
  if #active > 0 then
    -- Only now is Redis's clock needed: to drop the shards gone quiet.
    local now = now_ms()
    for i = 1, #active, 2 do
      if to_number(active[i + 1]) < now then
        call('ZREM', active_key, active[i])
      else
        reply[#reply + 1] = active[i]
      end
    end
  end
  return reply
end

return sweep_lease(KEYS, ARGV)
