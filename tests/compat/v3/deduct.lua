#!lua
--[[
stockgate DEDUCT.

Deducts qty units of one SKU's stock at most once per request_id, atomically.
stockgate validates every argument before it calls this script; the script
checks them again (defence in depth): a bad qty or order_no (the caller's)
is code 3, a bad window, mode, key layout or nonce (stockgate's own) is a
BADCALL error. Every read and check happens before the first write, so a
failure or an error reply never leaves a partial change behind. The `#!lua`
line above declares a Redis 7 script with no flags: Redis then treats it as
a write, so a replica redirects the call (MOVED) instead of failing at the
first write, and an out-of-memory server rejects it before it runs.

KEYS[1]  stock key           <prefix>:{<sku>}                  integer string
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id> see lua/common.lua, always with a TTL
         (one hash tag, so both keys live in one cluster slot)

ARGV[1]  qty                 decimal integer from 1 to ARGV[4]
ARGV[2]  order_no            0 to 128 printable ASCII bytes ("" when none)
ARGV[3]  retry window        milliseconds, at least 60000: the record's TTL
ARGV[4]  max qty             decimal integer
ARGV[5]  missing stock       "error" or "zero"
ARGV[6]  nonce               1 to 32 hex digits, new for every call
ARGV[7]  replicate           "1" with --wait-replicas, "0" (or absent) otherwise:
                             a reply stating an existing record (0 for a call
                             sent again, 1, 4) then writes it again unchanged,
                             so the WAIT after it confirms that record (see
                             replicate_again in lua/common.lua)

Replies. The first four elements are fixed for good; callers ignore any more.
VERSION is the script set's version (lua/common.lua).
  {0, remain, order_no, VERSION}          deducted; remain is the stock after it
                                          (a call sent again that finds its own
                                          nonce answers 0 with the stock now)
  {1, stock, first_order_no, VERSION}     duplicate: request_id already deducted;
                                          nothing changed
  {2, stock, "", VERSION}                 insufficient stock; nothing changed
  {3, stock, "", VERSION, reason}         invalid parameters; nothing changed
  {4, stock, "", VERSION}                 revoked: this request_id was reverted,
                                          or revoked by a REVERT that came first;
                                          it never deducts again
(stock is -1 where it was not read or the stock key is missing.)
Error replies (nothing changed):
  BADCALL ...     an argument stockgate supplies is wrong (ARGV[3..7], the keys)
  UNKNOWNSKU ...  the stock key does not exist and ARGV[5] is "error"
  BADSTOCK ...    the stock value is not an integer within +-(2^53 - 1)
  BADRECORD ...   the idempotency record has a shape this version can't read

A duplicate never refreshes the record's TTL: the retry window counts from
the deduction, not from the latest retry (with ARGV[7] "1" it writes the
record again with the same absolute expiry).
]]

--@common

local stock_key = KEYS[1]
local record_key = KEYS[2]
local qty_arg, order_no, window_arg, max_arg, missing, nonce, replicate =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]

local function invalid(reason, stock)
  return {3, stock or -1, '', VERSION, reason}
end

-- stockgate's own arguments.
local window, bad = own_args(stock_key, record_key, window_arg, missing, nonce)
if not window then
  return bad
end
bad = bad_replicate(replicate)
if bad then
  return bad
end
local max_qty = positive_int(max_arg)
if not max_qty then
  return badcall('max qty must be a positive integer')
end

-- The caller's (stockgate has already checked them too).
local qty = positive_int(qty_arg)
if not qty or qty > max_qty then
  return invalid('qty must be an integer from 1 to ' .. tostring(max_arg))
end
if type(order_no) ~= 'string' or #order_no > 128 or string.find(order_no, '[^ -~]') then
  return invalid('order_no must be at most 128 printable ASCII bytes')
end

local stock = read_stock(stock_key)
if stock == false then
  return redis.error_reply(BADSTOCK)
end

-- Idempotency: a known request_id never deducts again.
local raw = redis.call('GET', record_key)
if raw then
  local record = parse_record(raw)
  if not record then
    return redis.error_reply(BADRECORD)
  end
  if record.state == 'R' or record.state == 'V' then
    replicate_again(replicate, record_key, raw)
    return {4, stock or -1, '', VERSION}
  end
  if record.qty ~= qty_arg then
    return invalid('request_id was already used with qty ' .. record.qty .. ' on this sku', stock or -1)
  end
  replicate_again(replicate, record_key, raw)
  if record.nonce == nonce then
    -- This very call, sent again: it deducted the first time.
    return {0, stock or -1, record.order_no, VERSION}
  end
  return {1, stock or -1, record.order_no, VERSION}
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
redis.call('SET', record_key, record_text('D', qty_arg, nonce, '', order_no), 'PX', window)
return {0, remain, order_no, VERSION}
