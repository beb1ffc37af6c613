#!lua
--[[
stockgate DEDUCT, script version 1.

Deducts qty units of one SKU's stock at most once per request_id, atomically.
stockgate validates every argument before it calls this script; the script
checks them again (defence in depth) and answers code 3 on a bad one.
Every read and check happens before the first write, so a failure or an
error reply never leaves a partial change behind. The `#!lua` line above
declares a Redis 7 script with no flags: Redis then treats it as a write, so
a replica redirects the call (MOVED) instead of failing at the first write,
and an out-of-memory server rejects it before it runs.

KEYS[1]  stock key           <prefix>:{<sku>}                  integer string
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id> "D:<qty>:<order_no>", always with a TTL
         (one hash tag, so both keys live in one cluster slot)

ARGV[1]  qty                 decimal integer from 1 to ARGV[4]
ARGV[2]  order_no            0 to 128 printable ASCII bytes ("" when none)
ARGV[3]  retry window        milliseconds, at least 60000: the record's TTL
ARGV[4]  max qty             decimal integer
ARGV[5]  missing stock       "error" or "zero"

Replies. The first four elements are fixed for good; callers ignore any more.
  {0, remain, order_no, 1}           deducted; remain is the stock after it
  {1, stock, first_order_no, 1}      duplicate: request_id already applied;
                                     nothing changed (stock is -1 when the
                                     stock key has since disappeared)
  {2, stock, "", 1}                  insufficient stock; nothing changed
  {3, stock, "", 1, reason}          invalid parameters; nothing changed
                                     (stock is -1 when not read)
Error replies (nothing changed):
  UNKNOWNSKU ...  the stock key does not exist and ARGV[5] is "error"
  BADSTOCK ...    the stock value is not an integer within +-(2^53 - 1)
  BADRECORD ...   the idempotency record has a shape this version can't read

A duplicate never refreshes the record's TTL: the retry window counts from
the deduction, not from the latest retry.
]]

local VERSION = 1
-- Lua numbers are doubles: integers beyond 2^53 - 1 lose precision.
local EXACT = 9007199254740991

local stock_key = KEYS[1]
local record_key = KEYS[2]
local qty_arg, order_no, window_arg, max_arg, missing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local function invalid(reason, stock)
  return {3, stock or -1, '', VERSION, reason}
end

local function positive_int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^[1-9]%d*$') then
    return nil
  end
  return tonumber(s)
end

-- Arguments (stockgate has already checked all of these).
local max_qty = positive_int(max_arg)
local qty = positive_int(qty_arg)
if not max_qty or not qty or qty > max_qty then
  return invalid('qty must be an integer from 1 to ' .. tostring(max_arg))
end
if type(order_no) ~= 'string' or #order_no > 128 or string.find(order_no, '[^ -~]') then
  return invalid('order_no must be at most 128 printable ASCII bytes')
end
local window = positive_int(window_arg)
if not window or window < 60000 then
  return invalid('retry window must be at least 60000 ms')
end
if missing ~= 'error' and missing ~= 'zero' then
  return invalid('missing-stock mode must be "error" or "zero"')
end
-- The record key must be the stock key plus ":req:<request_id>", so both
-- share the stock key's hash tag.
local record_prefix = stock_key .. ':req:'
local request_id = string.sub(record_key, #record_prefix + 1)
if not string.find(stock_key, '{', 1, true)
  or string.sub(record_key, 1, #record_prefix) ~= record_prefix
  or #request_id < 1 or #request_id > 128
  or string.find(request_id, '[^!-~]') or string.find(request_id, '[{}]') then
  return invalid('keys do not follow the stockgate key layout')
end

-- Stock: nil when the key is missing, otherwise an exact integer.
local function read_stock()
  local raw = redis.call('GET', stock_key)
  if not raw then
    return nil
  end
  local n = nil
  if #raw <= 17 and string.match(raw, '^%-?%d+$') then
    n = tonumber(raw)
  end
  if not n or n > EXACT or n < -EXACT then
    return false
  end
  return n
end

local stock = read_stock()
if stock == false then
  return redis.error_reply('BADSTOCK stock value is not an integer; nothing was changed')
end

-- Idempotency: an applied request_id answers 1 whatever the stock is now.
local record = redis.call('GET', record_key)
if record then
  local state, first_qty, first_order_no = string.match(record, '^(%u):(%d+):(.*)$')
  if state ~= 'D' then
    return redis.error_reply('BADRECORD idempotency record has an unknown shape; nothing was changed')
  end
  if first_qty ~= qty_arg then
    return invalid('request_id was already used with qty ' .. first_qty .. ' on this sku', stock or -1)
  end
  return {1, stock or -1, first_order_no, VERSION}
end

if stock == nil then
  if missing == 'zero' then
    return {2, 0, '', VERSION}
  end
  return redis.error_reply('UNKNOWNSKU no stock is recorded for this sku; nothing was changed')
end
if stock < qty then
  return {2, stock, '', VERSION}
end

-- Writes: only after every check above has passed.
local remain = redis.call('DECRBY', stock_key, qty)
redis.call('SET', record_key, 'D:' .. qty_arg .. ':' .. order_no, 'PX', window)
return {0, remain, order_no, VERSION}
