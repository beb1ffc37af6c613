#!lua
--[[
stockgate STOCK.GET: one SKU's stock. Like every call on a SKU it first
gives the SKU's expired holds back to stock, so the stock it shows counts
every unit whose hold ran out by Redis time.

KEYS[1]  stock key   <prefix>:{<sku>}
KEYS[2]  holds       <prefix>:{<sku>}:holds
KEYS[3]  held units  <prefix>:{<sku>}:held
KEYS[4]  journal marker, KEYS[5] journal (declared: lua/common.lua, request_fault)
ARGV[1]  retry window, milliseconds, at least 60000 (a released record's TTL)
ARGV[2]  journal, "1" with --journal (lua/common.lua, journal_of: a release journals `expire` entries)

Replies: {stock, held, next_expiry, released}
  stock        the available stock as stored, or false (nil) when missing
  held         units on hold now
  next_expiry  the earliest expiry among the SKU's holds (ms of Redis time;
               0 when it has none)
  released     expired holds this call gave back to stock
Error replies: BADCALL when the keys do not follow the layout or the
window is missing. A stock
value that is not an integer is shown as stored, and nothing is released.
]]

--@common

local function get(KEYS, ARGV)
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
  local released = 0
  local raw_stock = call('GET', stock_key)
  if raw_stock == LOCATED then
    return error_reply(LOCATEDSKU)
  end
  local stock = parse_stock(raw_stock)
  if stock then
    stock, released = release_due(stock_key, holds_key, held_key, stock, nil, window, journal_key)
  end
  local shown = call('GET', stock_key)
  return {shown, to_number(call('GET', held_key) or '0'), earliest_hold(holds_key), released}
end

return get(KEYS, ARGV)
