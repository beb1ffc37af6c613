#!lua
--[[
stockgate HOLD.

Puts qty units of one SKU on hold for ttl_ms, at most once per request_id,
atomically: the stock drops by qty at once, as for a DEDUCT, and the units
come back by themselves when the hold runs out unless a CONFIRM makes it
final first. Expiry is Redis time (TIME), never a sidecar's clock: a hold
lasts from held_at to expires_at = held_at + ttl_ms, and is over at
expires_at. Nothing needs to run for the units to come back: every call on
the SKU releases its expired holds first (lua/common.lua, release_due), and
stockgate's sweeper calls lua/release.lua for SKUs nobody touches.

This script's column of the state machine (the whole table is in
lua/revert.lua):
  none       take qty, ->HELD 0; 2 when the stock is short (nothing written,
             so the id may hold later); UNKNOWNSKU when the sku has no stock
             key and --missing-stock is "error" (2 with "zero")
  HELD       1, the same hold (0 for this very call sent again); 3 when
             the qty differs; a hold that ran out is released: 5
  CONFIRMED  1 (3 when the qty differs)
  EXPIRED    5: the hold ran out; this id never holds again
  DEDUCTED   3: the id is a DEDUCT's
  REVERTED, REVOKED  4

KEYS[1]  stock key           <prefix>:{<sku>}
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id>
KEYS[3]  holds               <prefix>:{<sku>}:holds   sorted set: request_id by expiry (ms)
KEYS[4]  held units          <prefix>:{<sku>}:held    integer string
ARGV[1]  qty                 decimal integer from 1 to ARGV[6]
ARGV[2]  order_no            0 to 128 printable ASCII bytes
ARGV[3]  ttl_ms              decimal integer from 1000 to ARGV[4]
ARGV[4]  max hold            milliseconds (--max-hold)
ARGV[5]  retry window        milliseconds, at least 60000: how long the
                             record lasts once the hold ends (a HELD record
                             has no TTL: the hold's units are in it)
ARGV[6]  max qty             decimal integer
ARGV[7]  missing stock       "error" or "zero"
ARGV[8]  nonce               1 to 32 hex digits, new for every call
ARGV[9]  replicate           "1" with --wait-replicas, "0" (or absent)
ARGV[10] journal             as lua/deduct.lua ARGV[8]

Replies (lua/common.lua, answer()): {code, stock, order_no, VERSION, reason,
expires_at, released, held_ms, event}; expires_at is the hold's expiry in
milliseconds of Redis time (0 when there is no hold to speak of), event
"placed" for a 0.
  {0, remain, order_no, .., "", expires_at}   held now (or this call, sent
                                              again, held the first time)
  {1, stock, order_no, .., "", expires_at}    this id already holds, or its
                                              hold was confirmed
  {2, stock, "", ..}                          insufficient; nothing changed
  {3, stock, "", .., reason}                  invalid; nothing changed
  {4, stock, "", ..}                          reverted or revoked
  {5, stock, order_no, .., "", expires_at}    the id's hold ran out
Error replies (nothing changed): BADCALL, UNKNOWNSKU, BADSTOCK, BADRECORD,
as for DEDUCT.
]]

--@common

local stock_key, record_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local qty_arg, order_no, ttl_arg, max_hold_arg, window_arg, max_arg, missing, nonce, replicate =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]

local window, bad = own_args(KEYS, window_arg, missing, nonce)
if not window then
  return bad
end
bad = bad_replicate(replicate)
if bad then
  return bad
end
local journal_key, refused = journal_of(stock_key, ARGV[10])
if refused then
  return refused
end
local max_qty = positive_int(max_arg)
local max_hold = positive_int(max_hold_arg)
if not max_qty or not max_hold or max_hold < 1000 then
  return badcall('max qty and max hold must be positive integers, max hold at least 1000')
end

local qty = positive_int(qty_arg)
if not qty or qty > max_qty then
  return answer(3, -1, '', 'qty must be an integer from 1 to ' .. max_arg)
end
if type(order_no) ~= 'string' or #order_no > 128 or string.find(order_no, '[^ -~]') then
  return answer(3, -1, '', 'order_no must be at most 128 printable ASCII bytes')
end
local ttl = positive_int(ttl_arg)
if not ttl or ttl < 1000 or ttl > max_hold then
  return answer(3, -1, '', 'ttl_ms must be an integer from 1000 to ' .. max_hold_arg)
end

-- The read, the stored data's checks and the SKU's expired holds given
-- back, before anything is decided.
local failed, stock, raw, record, _, released, now = open_request(KEYS, window, journal_key)
if failed then
  return failed
end
if stock == nil and missing ~= 'zero' then
  return redis.error_reply(UNKNOWNSKU)
end
if now == 0 then
  now = now_ms()
end

if record then
  local own
  record, own = release_own(stock_key, holds_key, held_key, record_key, record, now, window,
    journal_key)
  if own == 1 then
    stock = (stock or 0) + tonumber(record.qty)
    released = released + 1
  end
  local state = record.state
  if state == 'R' or state == 'V' then
    replicate_again(replicate, record_key)
    return answer(4, stock, '', '', 0, released)
  end
  if state == 'D' then
    return answer(3, stock, '', 'request_id was used by a DEDUCT on this sku', 0, released)
  end
  if state == 'X' then
    if own == 0 then
      replicate_again(replicate, record_key)
    end
    return answer(5, stock, record.order_no, '', record.expires, released)
  end
  -- HELD or CONFIRMED.
  -- The qty the HOLD asked for, which a shrunk hold keeps apart.
  local asked = record.asked or record.qty
  if asked ~= qty_arg then
    return answer(3, stock, '', 'request_id was already used with qty ' .. asked .. ' on this sku', 0, released)
  end
  replicate_again(replicate, record_key)
  if record.nonce == nonce and state == 'H' then
    -- This very call, sent again: it held the first time.
    return answer(0, stock, record.order_no, '', record.expires, released, 0, 'placed')
  end
  return answer(1, stock, record.order_no, '', record.expires, released)
end

if stock == nil then
  return answer(2, 0, '', '', 0, released)
end
if stock < qty then
  return answer(2, stock, '', '', 0, released)
end

-- Writes: only after every check above has passed.
local expires = now + ttl
local remain = redis.call('DECRBY', stock_key, qty)
local held = redis.call('INCRBY', held_key, qty)
local id = string.sub(record_key, #stock_key + 6)
if journal_key then
  journal(journal_key, 'hold', id, '-' .. qty_arg, qty_arg, remain, held, order_no)
end
redis.call('ZADD', holds_key, expires, id)
-- No TTL: the units held are known from this record alone, so it must
-- outlive the hold however long nothing touches the SKU. Whatever ends the
-- hold (CONFIRM, REVERT, the release at its expiry) gives the record its
-- retry window then.
redis.call('SET', record_key,
  record_text('H', qty_arg, nonce, int_text(expires) .. '.' .. int_text(now), order_no))
return answer(0, remain, order_no, '', expires, released, 0, 'placed')
