#!lua
--[[
stockgate's sweep index: marks one SKU for the sweeper to look at now.
stockgate sends it with every HOLD, on the same node pipe just before the
HOLD itself (the index shard lives in the SKU's range of slots, so usually
on its primary: the mark reaches Redis first, and replicates first). The
sweeper then finds when the SKU's holds expire (lua/release.lua) and files
the SKU under that time (lua/due_sweep.lua).

KEYS[1]  due     <prefix>:{<shard tag>}:due     sorted set: sku by when to look (ms)
KEYS[2]  marks   <prefix>:{<shard tag>}:marks   hash: sku -> when it was marked (ms)
ARGV[1]  sku

Replies: the mark's time, in milliseconds of Redis time.
]]

--@common

local now = now_ms()
redis.call('ZADD', KEYS[1], 0, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], int_text(now))
return now
