#!lua
--[[
stockgate DEDUCT.

Deducts qty units of one SKU's stock at most once per request_id, atomically.
stockgate validates every argument before it calls this script; the script
checks them again (defence in depth) and answers code 3 on a bad one.
Every read and check happens before the first write, so a failure or an
error reply never leaves a partial change behind. The `#!lua` line above
declares a Redis 7 script with no flags: Redis then treats it as a write, so
a replica redirects the call (MOVED) instead of failing at the first write,
and an out-of-memory server rejects it before it runs.

KEYS[1]  stock key           <prefix>:{<sku>}                  integer string
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id> see lua/common.lua, always with a TTL
         (one hash tag, so both keys live in one cluster slot)

ARGV[1]  qty                 decimal integer from 1 to ARGV[4]
ARGV[2]  order_no            0 to 128 printable ASCII bytes ("" when none)
ARGV[3]  retry window        milliseconds, at least 60000: the record's TTL
ARGV[4]  max qty             decimal integer
ARGV[5]  missing stock       "error" or "zero"

Replies. The first four elements are fixed for good; callers ignore any more.
VERSION is the script set's version (lua/common.lua).
  {0, remain, order_no, VERSION}          deducted; remain is the stock after it
  {1, stock, first_order_no, VERSION}     duplicate: request_id already deducted;
                                          nothing changed
  {2, stock, "", VERSION}                 insufficient stock; nothing changed
  {3, stock, "", VERSION, reason}         invalid parameters; nothing changed
  {4, stock, "", VERSION}                 revoked: this request_id was reverted,
                                          or revoked by a REVERT that came first;
                                          it never deducts again
(stock is -1 where it was not read or the stock key is missing.)
Error replies (nothing changed):
  UNKNOWNSKU ...  the stock key does not exist and ARGV[5] is "error"
  BADSTOCK ...    the stock value is not an integer within +-(2^53 - 1)
  BADRECORD ...   the idempotency record has a shape this version can't read

A duplicate never refreshes the record's TTL: the retry window counts from
the deduction, not from the latest retry.
]]

--@common

local stock_key = KEYS[1]
local record_key = KEYS[2]
local qty_arg, order_no, window_arg, max_arg, missing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local function invalid(reason, stock)
  return {3, stock or -1, '', VERSION, reason}
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
local window, why = shared_args(stock_key, record_key, window_arg, missing)
if not window then
  return invalid(why)
end

local stock = read_stock(stock_key)
if stock == false then
  return redis.error_reply(BADSTOCK)
end

-- Idempotency: a known request_id never deducts again.
local record = redis.call('GET', record_key)
if record then
  local state, first_qty, first_order_no = parse_record(record)
  if state == 'R' or state == 'V' then
    return {4, stock or -1, '', VERSION}
  end
  if state ~= 'D' then
    return redis.error_reply(BADRECORD)
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
  return redis.error_reply(UNKNOWNSKU)
end
if stock < qty then
  return {2, stock, '', VERSION}
end

-- Writes: only after every check above has passed.
local remain = redis.call('DECRBY', stock_key, qty)
redis.call('SET', record_key, 'D:' .. qty_arg .. ':' .. order_no, 'PX', window)
return {0, remain, order_no, VERSION}
