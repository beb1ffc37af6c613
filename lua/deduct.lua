#!lua
--[[
stockgate DEDUCT.

Deducts qty units of one SKU's stock at most once per request_id, atomically.
stockgate validates every argument before it calls this script; the script
checks them again (defence in depth): a bad qty or order_no (the caller's)
is code 3, a bad window, mode, key layout or nonce (stockgate's own) is a
BADCALL error. Every read and check that can fail happens before the first
write (the release of the SKU's expired holds, lua/common.lua, included),
so an error reply never leaves a change behind. The `#!lua` line above
declares a Redis 7 script with no flags: Redis then treats it as a write,
so a replica redirects the call (MOVED) instead of failing at the first
write, and an out-of-memory server rejects it before it runs.

KEYS[1]  stock key           <prefix>:{<sku>}                  integer string
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id> see lua/common.lua, always with a TTL
KEYS[3]  holds               <prefix>:{<sku>}:holds            sorted set: request_id by expiry
KEYS[4]  held units          <prefix>:{<sku>}:held             integer string
         (one hash tag, so all four live in one cluster slot)

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
ARGV[8]  journal             "1" with --journal, "0" or absent otherwise. A
                             SKU that has a journal gets the change's entry
                             in this call whatever the flag (lua/common.lua,
                             journal_of); with "1", a call that would change
                             a SKU without one is refused with NOJOURNAL,
                             nothing changed

Replies (lua/common.lua's answer(): {code, stock, order_no, VERSION,
reason, expires_at, released, held_ms}). The first four elements are fixed
for good; callers ignore any more. VERSION is the script set's version.
  {0, remain, order_no, ...}          deducted; remain is the stock after it
                                      (a call sent again that finds its own
                                      nonce answers 0 with the stock now)
  {1, stock, first_order_no, ...}     duplicate: request_id already deducted;
                                      nothing changed
  {2, stock, "", ...}                 insufficient stock; nothing changed
  {3, stock, "", VERSION, reason}     invalid parameters, or the request_id is
                                      a hold's (HOLD): nothing changed
  {4, stock, "", ...}                 revoked: this request_id was reverted,
                                      or revoked by a REVERT that came first;
                                      it never deducts again
(stock is -1 where it was not read or the stock key is missing.) reason is
"" but for code 3, expires_at 0; released counts the SKU's expired holds
this call gave back to stock first (lua/common.lua, release_due); a 2
carries the SKU's units still on hold as its tenth element (absent: 0).
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

local stock_key, record_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local qty_arg, order_no, window_arg, max_arg, missing, nonce, replicate =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]

local function invalid(reason, stock)
  return answer(3, stock, '', reason)
end

-- stockgate's own arguments.
local window, bad = own_args(KEYS, window_arg, missing, nonce)
if not window then
  return bad
end
bad = bad_replicate(replicate)
if bad then
  return bad
end
-- The journal's existence is not asked here, as the other scripts do
-- (lua/common.lua, journal_of), but where it matters: before a release of
-- expired holds, which journals, and by the deduction's own entry, added
-- with NOMKSTREAM as the first write. A DEDUCT that changes nothing needs
-- no journal, and the one that does saves an EXISTS (3k instructions of
-- the entry's 22k, docs/performance.md).
local journal_on = ARGV[8] == '1'
local journal_key = stock_key .. ':journal'
-- Whether journal_key (false when none) has been asked already.
local journal_known = false
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

-- The read, the stored data's checks and the SKU's expired holds given
-- back, before anything is decided: lua/common.lua's open_request, written
-- out here. DEDUCT is the hot path, and the helper's closure and call cost
-- it 3.6k instructions in Redis, 3% (`cargo bench --bench side_by_side --
-- script-cost`: 112k against 116k); HOLD, CONFIRM and REVERT call it.
local stock, raw, held = read_request(stock_key, record_key, held_key)
if stock == false then
  return redis.error_reply(BADSTOCK)
end
local record = raw and parse_record(raw)
if raw and not record then
  return redis.error_reply(BADRECORD)
end
if held > 0 then
  if redis.call('EXISTS', journal_key) == 0 then
    if journal_on then
      return redis.error_reply(NOJOURNAL)
    end
    journal_key = false
  end
  journal_known = true
end
local released, _, units
stock, released, _, units = release_due(stock_key, holds_key, held_key, stock, held, window,
  journal_key)
if released > 0 then
  -- What went back to stock is no longer held (the units counted: the
  -- stock's difference is a double's, rounded past 2^53).
  held = held - units
end

-- Idempotency: a known request_id never deducts again.
if record then
  if record.state == 'R' or record.state == 'V' then
    replicate_again(replicate, record_key)
    return answer(4, stock, '', '', 0, released)
  end
  if record.state ~= 'D' then
    return answer(3, stock, '', 'request_id holds units on this sku (HOLD); CONFIRM or REVERT it', 0, released)
  end
  if record.qty ~= qty_arg then
    return answer(3, stock, '', 'request_id was already used with qty ' .. record.qty .. ' on this sku', 0, released)
  end
  replicate_again(replicate, record_key)
  if record.nonce == nonce then
    -- This very call, sent again: it deducted the first time.
    return answer(0, stock, record.order_no, '', 0, released)
  end
  return answer(1, stock, record.order_no, '', 0, released)
end

if stock == nil then
  if missing == 'zero' then
    return answer(2, 0)
  end
  return redis.error_reply(UNKNOWNSKU)
end
if stock < qty then
  return answer(2, stock, '', '', 0, released, 0, '', math.max(held, 0))
end

-- Writes: only after every check above has passed. The arguments go to
-- Redis as the strings they came as (checked canonical above): a Lua
-- number passed to redis.call is formatted with snprintf, about 2.7k
-- instructions each. The entry goes first, so that a SKU without a
-- journal is refused having changed nothing; it states the stock after
-- the DECRBY that follows, computed here (exact: within +-(2^53 - 1)).
-- With the journal off, the entry goes to the SKU's journal if it has one:
-- an EXISTS, cheaper than an entry built for an XADD that finds no stream.
if journal_key and not journal_on and not journal_known
    and redis.call('EXISTS', journal_key) == 0 then
  journal_key = false
end
if journal_key and not redis.call('XADD', journal_key, 'NOMKSTREAM', '*', 'e',
    journal_entry('deduct', record_key:sub(#stock_key + 6), '-' .. qty_arg, '0', stock - qty,
      held > 0 and held or 0, order_no)) and journal_on then
  return redis.error_reply(NOJOURNAL)
end
local remain = redis.call('DECRBY', stock_key, qty_arg)
redis.call('SET', record_key, record_text('D', qty_arg, nonce, '', order_no), 'PX', window_arg)
return answer(0, remain, order_no, '', 0, released)
