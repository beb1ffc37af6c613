#!lua
--[[
stockgate STOCK.ADD: change one SKU's stock by a signed delta, atomically,
never below 0. A missing stock key counts as 0 (restocking a new SKU).

KEYS[1]  stock key   <prefix>:{<sku>}
ARGV[1]  delta       signed decimal integer, |delta| <= 2^53 - 1

Replies: the stock after the change (integer).
Error replies (nothing changed):
  NEGATIVE ...  the change would take the stock below 0
  BADSTOCK ...  the stock value is not an integer
  ERR ...       delta is not an integer
]]

--@common

local delta = nil
if type(ARGV[1]) == 'string' and #ARGV[1] <= 17 and string.match(ARGV[1], '^%-?%d+$') then
  delta = tonumber(ARGV[1])
end
if not delta or delta > EXACT or delta < -EXACT then
  return redis.error_reply('ERR delta must be an integer')
end

local stock = read_stock(KEYS[1])
if stock == false then
  return redis.error_reply(BADSTOCK)
end
local after = (stock or 0) + delta
if after < 0 then
  return redis.error_reply('NEGATIVE stock is ' .. tostring(stock or 0) .. '; adding ' .. ARGV[1] .. ' would take it below 0; nothing was changed')
end
if after > EXACT then
  return redis.error_reply('ERR stock would exceed 2^53 - 1; nothing was changed')
end
return redis.call('INCRBY', KEYS[1], ARGV[1])
