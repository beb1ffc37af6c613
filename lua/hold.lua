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
KEYS[3..6]          the SKU's holds, held units, journal marker, journal (see lua/deduct.lua)
ARGV[1]  qty                 decimal integer from 1 to max qty
ARGV[2]  order_no            0 to 128 printable ASCII bytes
ARGV[3]  ttl_ms              decimal integer from 1000 to max hold
ARGV[4]  settings            "<max hold> <window> <max qty> <missing> <flags>"
                             (lua/deduct.lua ARGV[3]): max hold in
                             milliseconds (--max-hold, at least 1000); the
                             retry window is how long the record lasts once
                             the hold ends (a HELD record has no TTL: the
                             hold's units are in it)
ARGV[5]  nonce               1 to 32 hex digits, new for every call

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

-- The words of its settings, and their shape (ARGV[4], lua/common.lua: settle).
local SETTINGS = {'max_hold', 'window', 'max_qty', 'missing'}
local SETTINGS_SHAPE = '^(%S+) (%S+) (%S+) (%S+) (%S+)$'

-- The reply of a hold placed (answer's shape: nothing after "placed" to
-- leave off), one table made once (for a library), set by each call.
-- Redis reads a function's reply before the next call runs.
local PLACED = {0, 0, '', VERSION, '', 0, 0, 0, 'placed'}

local function hold(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, record_key = KEYS[1], KEYS[2]
  local qty_arg, order_no, ttl_arg, nonce = ARGV[1], ARGV[2], ARGV[3], ARGV[5]

  local settings, refused = enter(KEYS, ARGV[4], SETTINGS, SETTINGS_SHAPE, nonce)
  if not settings then
    return refused
  end
  local window, replicate, journal_on = settings.window, settings.replicate, settings.journal
  local holds_key, held_key = holds_name, held_name
  local max_hold, max_hold_arg = settings.max_hold, settings.max_hold_arg

  local qty = positive_int(qty_arg)
  if not qty or qty > settings.max_qty then
    return answer(3, -1, '', 'qty must be an integer from 1 to ' .. settings.max_arg)
  end
  if not order_no or #order_no > 128 or find(order_no, '[^ -~]') then
    return answer(3, -1, '', 'order_no must be at most 128 printable ASCII bytes')
  end
  local ttl = positive_int(ttl_arg)
  if not ttl or ttl < 1000 or ttl > max_hold then
    return answer(3, -1, '', 'ttl_ms must be an integer from 1000 to ' .. max_hold_arg)
  end

  -- The read, the stored data's checks and the SKU's expired holds given
  -- back, before anything is decided.
  local failed, stock, _, record, _, released, now, journal_key =
    open_request(stock_key, record_key, window, journal_on)
  if failed then
    return failed
  end
  if stock == nil and not settings.missing_zero then
    return error_reply(UNKNOWNSKU)
  end
  if now == 0 then
    now = now_ms()
  end

  if record then
    local own
    record, own, stock, released = release_own(stock_key, holds_key, held_key,
      record_key, record, now, window, journal_key, stock, released)
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
  local remain = call('DECRBY', stock_key, qty_arg)
  local held = call('INCRBY', held_key, qty_arg)
  local id = sub(record_key, #req_prefix + 1)
  if journal_key then
    journal(journal_key, 'hold', id, '-' .. qty_arg, qty_arg, remain, held, order_no)
  end
  local expires_text = int_text(expires)
  call('ZADD', holds_key, expires_text, id)
  -- No TTL: the units held are known from this record alone, so it must
  -- outlive the hold however long nothing touches the SKU. Whatever ends the
  -- hold (CONFIRM, REVERT, the release at its expiry) gives the record its
  -- retry window then.
  call('SET', record_key,
    record_text('H', qty_arg, nonce, expires_text .. '.' .. int_text(now), order_no))
  PLACED[2], PLACED[3], PLACED[6], PLACED[7] = remain, order_no, expires, released
  return PLACED
end

return hold(KEYS, ARGV)
