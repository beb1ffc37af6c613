#!lua
--[[
stockgate HOLD.EXTEND and HOLD.SHRINK: change a hold while it is still
held, at most once per change_id, atomically.

  extend  the hold now lasts until now + ttl_ms (Redis time, TIME), at most
          until its start (held_at) + max hold, and never earlier than it
          lasts already: an extension only moves the expiry later. The
          hold's entry in the SKU's holds set moves with it, so any call on
          the SKU and the sweeper release it at the new time. No journal
          entry: neither the stock nor the units held change.
  shrink  qty of the hold's units go back to stock at once; the rest stays
          held with its expiry, and a CONFIRM then takes what is left.
          qty runs from 1 to the units held less one: giving every unit
          back is a REVERT. Journaled as a REVERT of a hold is (`cancel`,
          stock +qty, held -qty). The record keeps the qty its HOLD asked
          for (lua/common.lua, parse_record), so a HOLD sent again still
          answers 1.

Each change names itself with a change_id, recorded under the SKU for the
retry window: the same change_id again (the same hold, kind and amount)
answers 1 with the expiry it set (0 for this very call sent again) and
changes nothing; with anything else it answers 3. A refusal writes no
record, so a change refused (3, 4, 5) is decided afresh when sent again.

This script's column, by the hold's state (the rest of the table is in
lua/revert.lua):
  none       3: no hold under this request_id (nothing written: a HOLD
             that arrives later holds as usual)
  HELD       extend: 0; 3 past the bound or not later than now
             shrink: 0; 3 when qty is not below the units held
  HELD, ran out   the hold is released first: 5
  CONFIRMED  extend: 1 (the units are sold; nothing to keep)
             shrink: 3 (the units are sold; a REVERT gives them all back)
  EXPIRED    5
  DEDUCTED   3: the id is a DEDUCT's
  REVERTED, REVOKED  4

KEYS[1]  stock key           <prefix>:{<sku>}
KEYS[2]  the hold's record   <prefix>:{<sku>}:req:<request_id>
KEYS[3]  holds               <prefix>:{<sku>}:holds
KEYS[4]  held units          <prefix>:{<sku>}:held
KEYS[5]  change record       <prefix>:{<sku>}:chg:<change_id>
         "3:<kind>:<amount>:<nonce>:<expires_at>:<request_id>", kind E
         (extend) or S (shrink), expires_at the hold's expiry after it
ARGV[1]  kind                "extend" or "shrink"
ARGV[2]  amount              extend: ttl_ms, 1000 to ARGV[3];
                             shrink: qty, 1 to ARGV[5]
ARGV[3]  max hold            milliseconds (--max-hold)
ARGV[4]  retry window        milliseconds, at least 60000: the change
                             record's TTL
ARGV[5]  max qty             decimal integer
ARGV[6]  missing stock       "error" or "zero"
ARGV[7]  nonce               1 to 32 hex digits, new for every call
ARGV[8]  replicate           "1" with --wait-replicas, "0" (or absent)
ARGV[9]  journal             as lua/deduct.lua ARGV[8]

Replies (lua/common.lua, answer()): {code, stock, order_no, VERSION,
reason, expires_at, released, held_ms, event}, as HOLD's:
  {0, stock, order_no, .., "", expires_at, released, 0, event}
        changed now (event "extended" or "shrunk"); stock after it
  {1, stock, order_no, .., "", expires_at}   this change_id was applied
        (expires_at as it set it); or an extension of a confirmed hold
  {3, stock, "", .., reason}                 invalid; nothing changed
  {4, stock, "", ..}                         reverted or revoked
  {5, stock, order_no, .., "", expires_at}   the hold ran out
Error replies (nothing changed): BADCALL, UNKNOWNSKU, BADSTOCK, BADRECORD.
]]

--@common

local stock_key, record_key, holds_key, held_key, change_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local kind, amount_arg, max_hold_arg, window_arg, max_arg, missing, nonce, replicate =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]

local window, bad = own_args({stock_key, record_key, holds_key, held_key}, window_arg, missing,
  nonce)
if not window then
  return bad
end
if type(change_key) ~= 'string' or KEYS[6]
  or not record_key_under(stock_key .. ':chg:', change_key) then
  return badcall('keys do not follow the stockgate key layout')
end
bad = bad_replicate(replicate)
if bad then
  return bad
end
local letter = ({extend = 'E', shrink = 'S'})[kind]
local max_qty = positive_int(max_arg)
local max_hold = positive_int(max_hold_arg)
if not letter or not max_qty or not max_hold or max_hold < 1000 then
  return badcall('kind must be extend or shrink, max qty and max hold positive integers, max hold at least 1000')
end
local journal_key, refused = journal_of(stock_key, ARGV[9])
if refused then
  return refused
end

local amount = positive_int(amount_arg)
if letter == 'E' and (not amount or amount < 1000 or amount > max_hold) then
  return answer(3, -1, '', 'ttl_ms must be an integer from 1000 to ' .. max_hold_arg)
end
if letter == 'S' and (not amount or amount > max_qty) then
  return answer(3, -1, '', 'qty must be an integer from 1 to ' .. max_arg)
end

-- The read, the stored data's checks and the SKU's expired holds given
-- back, before anything is decided.
local failed, stock, _, record, _, released, now = open_request(KEYS, window, journal_key)
if failed then
  return failed
end
if stock == nil and missing ~= 'zero' then
  return redis.error_reply(UNKNOWNSKU)
end
local id = string.sub(record_key, #stock_key + 6)

-- This change_id already applied: its answer again, nothing changed.
local done = redis.call('GET', change_key)
if done then
  local was, was_amount, was_nonce, was_expires, was_id =
    string.match(done, '^3:([ES]):(%d+):(%x*):(%d+):(.*)$')
  if not was then
    return redis.error_reply(BADRECORD)
  end
  if was ~= letter or was_amount ~= amount_arg or was_id ~= id then
    return answer(3, stock, '', 'change_id was already used for another change on this sku', 0,
      released)
  end
  replicate_again(replicate, change_key)
  local order_no = record and record.order_no or ''
  if was_nonce == nonce then
    -- This very call, sent again: it changed the hold the first time.
    return answer(0, stock, order_no, '', tonumber(was_expires), released, 0,
      letter == 'E' and 'extended' or 'shrunk')
  end
  return answer(1, stock, order_no, '', tonumber(was_expires), released)
end

if not record then
  return answer(3, stock, '', 'no hold under this request_id on this sku', 0, released)
end
if now == 0 then
  now = now_ms()
end
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
if state == 'C' then
  if letter == 'S' then
    return answer(3, stock, '', 'the hold was confirmed: its units are sold (REVERT gives them all back)', 0,
      released)
  end
  replicate_again(replicate, record_key)
  return answer(1, stock, record.order_no, '', record.expires, released)
end

-- HELD, in time.
local asked = record.asked or record.qty
local expires, qty, event = record.expires, record.qty, 'extended'
if letter == 'E' then
  local bound = record.held_at + max_hold
  expires = now + amount
  if expires > bound then
    return answer(3, stock, '', 'the hold may last until ' .. int_text(bound)
      .. ' at most (max hold ' .. max_hold_arg .. ' ms from its start)', 0, released)
  end
  if expires <= record.expires then
    return answer(3, stock, '', 'the hold already lasts until ' .. int_text(record.expires)
      .. ': an extension only moves it later', 0, released)
  end
else
  local held_qty = tonumber(record.qty)
  if amount >= held_qty then
    return answer(3, stock, '', 'qty must be below the ' .. record.qty
      .. ' units held (REVERT gives every unit back)', 0, released)
  end
  qty, event = int_text(held_qty - amount), 'shrunk'
end

-- Writes: only after every check above has passed.
if letter == 'E' then
  redis.call('ZADD', holds_key, expires, id)
else
  stock = redis.call('INCRBY', stock_key, amount)
  local held = unhold(held_key, amount)
  if journal_key then
    journal(journal_key, 'cancel', id, amount_arg, '-' .. amount_arg, stock, held,
      record.order_no)
  end
end
local aux = int_text(expires) .. '.' .. int_text(record.held_at)
if asked ~= qty then
  aux = aux .. '.' .. asked
end
-- The hold's record keeps its HOLD's nonce (a HOLD sent again still finds
-- it) and its lack of a TTL.
redis.call('SET', record_key, record_text('H', qty, record.nonce, aux, record.order_no), 'KEEPTTL')
redis.call('SET', change_key,
  '3:' .. letter .. ':' .. amount_arg .. ':' .. nonce .. ':' .. int_text(expires) .. ':' .. id,
  'PX', window)
return answer(0, stock, record.order_no, '', expires, released, 0, event)
