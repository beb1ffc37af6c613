#!lua
--[[
stockgate's journal, opened for one SKU before its first entry (issue 26;
lua/common.lua, journal_of): stockgate lists the SKU in its shard's set
of journals, then makes the SKU's stream, in that order and each with a
call of its own (the set lives in another slot). A stream therefore never
exists unlisted, and the sink, which reads the sets, finds every journal
without a scan. Both steps are idempotent: a stockgate that dies between
them leaves a SKU listed with no stream, which the next call opens again.

`stockgate journal retire` takes the steps back, in the other order: it
deletes the stream only when it holds no entry (so no entry the sink has
not moved is lost, whatever calls run meanwhile), then takes the SKU off
its set. Every call on a SKU with a journal appends to it, whatever the
sidecar's --journal; once the stream is gone, sidecars with the journal
off write none (docs/books.md, Turning the journal off).

KEYS[1]  list, unlist:  the shard's set   <prefix>:{<shard tag>}:journals
         make, retire:  the SKU's journal <prefix>:{<sku>}:journal
ARGV[1]  op      list | make | retire | unlist
ARGV[2]  list, unlist: the sku

Replies: {0}, done (whether it was there already or not; the shape of a
code, so that with --wait-replicas stockgate makes the stream only once
the listing is on the replicas); retire: {1, entries} when the stream
holds entries and stays. Errors: BADCALL for anything else.
]]

--@common

local key, op = KEYS[1], ARGV[1]
if op == 'list' or op == 'unlist' then
  if type(ARGV[2]) ~= 'string' or ARGV[2] == '' or not string.match(key, ':{[^}]+}:journals$') then
    return badcall(op .. ' takes the shard set and a sku')
  end
  redis.call(op == 'list' and 'SADD' or 'SREM', key, ARGV[2])
  return {0}
end
if op == 'retire' then
  if not string.match(key, '}:journal$') then
    return badcall('retire takes a journal key')
  end
  local entries = redis.call('EXISTS', key) == 1 and redis.call('XLEN', key) or 0
  if entries > 0 then
    return {1, entries}
  end
  redis.call('DEL', key)
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
