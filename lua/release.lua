#!lua
--[[
stockgate's sweeper, on one SKU: gives its expired holds back to stock, at
most RELEASE_BOUND of them (lua/common.lua), exactly as any call on the SKU
would. Releasing is idempotent: many sidecars may send it at once.

KEYS[1]  stock key   <prefix>:{<sku>}
KEYS[2]  holds       <prefix>:{<sku>}:holds
KEYS[3]  held units  <prefix>:{<sku>}:held
KEYS[4]  journal marker, KEYS[5] journal (declared: lua/common.lua, request_fault)
ARGV[1]  retry window, milliseconds, at least 60000 (a released record's TTL)
ARGV[2]  journal, "1" with --journal (lua/common.lua, journal_of: a release journals `expire` entries)

Replies: {released, next_at}
  released  holds released by this call
  next_at   when the sweeper should look at this SKU again (ms of Redis
            time): the earliest expiry among its holds now, which is in the
            past when a backlog remains; 0 when it has no holds. A SKU whose
            stock key is missing or not an integer keeps its holds and is
            looked at again in a minute.
Error replies: BADCALL when the keys do not follow the layout or the
window is missing.
]]

--@common

local function release(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3]
  sku_keys(stock_key)
  if not find(stock_key, '{', 1, true) or not side_keys_follow(KEYS, 2) then
    return badcall('keys do not follow the stockgate key layout')
  end
  local window = window_ms(ARGV[1])
  if not window then
    return badcall('retry window must be at least 60000 ms')
  end
  local journal_key, refused = journal_of(ARGV[2] == '1')
  if refused then
    return refused
  end
  local raw_stock = call('GET', stock_key)
  if raw_stock == LOCATED then
    return error_reply(LOCATEDSKU)
  end
  local stock = parse_stock(raw_stock)
  if not stock then
    if call('EXISTS', holds_key) == 0 then
      return {0, 0}
    end
    return {0, now_ms() + 60000}
  end
  local _, released = release_due(stock_key, holds_key, held_key, stock, nil, window, journal_key)
  return {released, earliest_hold(holds_key)}
end

return release(KEYS, ARGV)
