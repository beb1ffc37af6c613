#!lua
--[[
stockgate's journal, opened for one SKU before its first entry (issue 26;
lua/common.lua, journal): stockgate lists the SKU in its shard's set
of journals, then makes the SKU's stream, in that order and each with a
call of its own (the set lives in another slot). A stream therefore never
exists unlisted, and the sink, which reads the sets, finds every journal
without a scan. Both steps are idempotent: a stockgate that dies between
them leaves a SKU listed with no stream, which the next call opens again.

KEYS[1]  list:  the shard's set   <prefix>:{<shard tag>}:journals
         make:  the SKU's journal <prefix>:{<sku>}:journal
ARGV[1]  op      list | make
ARGV[2]  list: the sku

Replies: {0}, done (whether it was there already or not; the shape of a
code, so that with --wait-replicas stockgate makes the stream only once
the listing is on the replicas). Errors: BADCALL for anything else.
]]

--@common

local key, op = KEYS[1], ARGV[1]
if op == 'list' then
  if type(ARGV[2]) ~= 'string' or ARGV[2] == '' or not string.match(key, ':{[^}]+}:journals$') then
    return badcall('list takes the shard set and a sku')
  end
  redis.call('SADD', key, ARGV[2])
  return {0}
end
if op == 'make' then
  if not string.match(key, '}:journal$') then
    return badcall('make takes a journal key')
  end
  if redis.call('EXISTS', key) == 0 then
    -- An empty stream: one entry added and trimmed away at once. Its last
    -- id stays, so later ids never go below it.
    redis.call('XADD', key, 'MAXLEN', '0', '*', 'v', '1')
  end
  return {0}
end
return badcall('unknown op')
