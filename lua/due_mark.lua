#!lua
--[[
stockgate's sweep index: files one SKU for the sweeper no later than a hold
of it expires. stockgate sends it twice per HOLD (src/stock/sweeper.rs):

  before  beside the HOLD, with the hold's ttl: filed at now + ttl (the
          index's clock), so that the hold is found even if the stockgate
          dies before the HOLD answers;
  after   once the HOLD answered 0 or 1, with the hold's own expires_at
          (the SKU's primary's clock): filed exactly by it, however the
          sweeper's passes and the HOLD interleaved (a pass that released
          the SKU before the HOLD landed may file it under a later hold's
          expiry; this mark lowers it again, and its new mark tells that
          pass's filing to stand aside: lua/due_sweep.lua).

The score only goes down (ZADD LT): a SKU already due sooner stays so. The
sweeper then finds when the SKU's holds expire (lua/release.lua) and files
the SKU under that time (lua/due_sweep.lua). Each mark is a new value,
after every earlier one, even within one millisecond: a filing compares the
mark it listed with the mark now.

KEYS[1]  due     <prefix>:{<shard tag>}:due     sorted set: sku by when to look (ms)
KEYS[2]  marks   <prefix>:{<shard tag>}:marks   hash: sku -> its latest mark (ms)
ARGV[1]  sku
ARGV[2]  the hold's expires_at, ms of Redis time, or "" when not known yet
ARGV[3]  the hold's ttl, ms (used when ARGV[2] is ""); absent: now

Replies: the mark, in milliseconds of Redis time.
]]

--@common

local function due_mark(KEYS, ARGV)
  if not call then
    bind()
  end
  local due_key, marks_key, sku = KEYS[1], KEYS[2], ARGV[1]
  local now = now_ms()
  local at = to_number(ARGV[2] or '')
  if not at then
    at = now + (to_number(ARGV[3] or '') or 0)
  end
  local before = to_number(call('HGET', marks_key, sku) or '0') or 0
  local mark = before + 1 > now and before + 1 or now
  call('ZADD', due_key, 'LT', at, sku)
  call('HSET', marks_key, sku, int_text(mark))
  return mark
end

return due_mark(KEYS, ARGV)
