#!lua
--[[
stockgate CONFIRM.

Makes one hold final, at most once, atomically: its units stay deducted for
good and can never be released. Against its expiry, Redis decides: a
CONFIRM that runs before the hold's expires_at (Redis time) answers 0; one
that runs at or after it answers 5, whether or not anything has released
the hold yet (this script releases it then). Whichever of the two Redis
runs first wins, and the books show exactly one of them.

This script's column of the state machine (the whole table is in
lua/revert.lua):
  none       ->REVOKED 4: nothing was held; a late HOLD of the id is then
             refused (4), so a CONFIRM that overtook its HOLD leaves no hold
             behind that nobody will confirm (UNKNOWNSKU when the sku has no
             stock key and --missing-stock is "error")
  HELD       ->CONFIRMED 0; a hold that ran out is released: 5
  CONFIRMED  1 (0 for this very call sent again)
  EXPIRED    5
  REVERTED, REVOKED  4
  DEDUCTED   3: the id is a DEDUCT's, which needs no CONFIRM

KEYS[1]  stock key           <prefix>:{<sku>}
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id>
KEYS[3..6]          the SKU's holds, held units, journal marker, journal (see lua/deduct.lua)
ARGV[1]  settings            "<window> <missing> <flags>" (lua/deduct.lua ARGV[3])
ARGV[2]  nonce               1 to 32 hex digits, new for every call

Replies (lua/common.lua, answer()): {code, stock, order_no, VERSION, reason,
expires_at, released, held_ms, event}:
  {0, stock, order_no, .., "", expires_at, released, held_ms, "confirmed"}
                                   confirmed now; held_ms is how long the
                                   units were held
  {1, stock, order_no, .., "", expires_at}   already confirmed
  {3, stock, "", .., reason}                 the id is a DEDUCT's
  {4, stock, "", ..}                         cancelled (REVERT) or revoked
  {5, stock, order_no, .., "", expires_at}   the hold ran out first; its
                                             units went back to stock
Error replies (nothing changed): BADCALL, UNKNOWNSKU, BADSTOCK, BADRECORD.
]]

--@common

-- The words of its settings, and their shape (ARGV[1], lua/common.lua: settle).
local SETTINGS = {'window', 'missing'}
local SETTINGS_SHAPE = '^(%S+) (%S+) (%S+)$'

-- How long a hold was held, never below 0: Redis time can step back (a
-- failover to a primary whose clock is behind the old one's), and a hold
-- then seems placed in the future.
local function held_for(record, now)
  local ms = now - record.held_at
  return ms > 0 and ms or 0
end

-- The reply of a hold confirmed (answer's shape: nothing after
-- "confirmed" to leave off), one table made once (for a library), set by
-- each call. Redis reads a function's reply before the next call runs.
local CONFIRMED = {0, 0, '', VERSION, '', 0, 0, 0, 'confirmed'}

local function confirm(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, record_key, nonce = KEYS[1], KEYS[2], ARGV[2]

  local settings = SETTLED[ARGV[1]]
  if not settings then
    local bad
    settings, bad = settle(ARGV[1], SETTINGS, SETTINGS_SHAPE)
    if bad then
      return bad
    end
  end
  local bad = request_fault(KEYS, nonce)
  if bad then
    return bad
  end
  local window, replicate, journal_on = settings.window, settings.replicate, settings.journal
  local missing_zero = settings.missing_zero
  local holds_key, held_key = holds_name, held_name

  -- The read, the stored data's checks and the SKU's expired holds given
  -- back, before anything is decided.
  local failed, stock, _, record, _, released, now, journal_key =
    open_request(stock_key, record_key, window, journal_on)
  if failed then
    return failed
  end
  if stock == nil and not missing_zero then
    return error_reply(UNKNOWNSKU)
  end

  if not record then
    -- Nothing was held under this id: revoke it, so a HOLD that arrives
    -- after its CONFIRM holds nothing nobody would confirm.
    call('SET', record_key, record_text('V', '0', nonce, '', ''), 'PX', settings.window_arg)
    return answer(4, stock, '', '', 0, released)
  end

  if now == 0 then
    now = now_ms()
  end
  local own
  record, own, stock, released = release_own(stock_key, holds_key, held_key,
    record_key, record, now, window, journal_key, stock, released)
  local state = record.state
  if state == 'X' then
    if own == 0 then
      replicate_again(replicate, record_key)
    end
    return answer(5, stock, record.order_no, '', record.expires, released)
  end
  if state == 'R' or state == 'V' then
    replicate_again(replicate, record_key)
    return answer(4, stock, '', '', 0, released)
  end
  if state == 'D' then
    return answer(3, stock, '', 'request_id was used by a DEDUCT, which needs no CONFIRM', 0, released)
  end
  if state == 'C' then
    replicate_again(replicate, record_key)
    if record.nonce == nonce then
      -- This very call, sent again: it confirmed the first time.
      return answer(0, stock, record.order_no, '', record.expires, released,
        held_for(record, now), 'confirmed')
    end
    return answer(1, stock, record.order_no, '', record.expires, released)
  end

  -- HELD, in time. Writes: only after every check above has passed.
  local held = unhold(held_key, record.qty)
  local id = sub(record_key, #req_prefix + 1)
  if journal_key then
    journal(journal_key, 'confirm', id, '0', '-' .. record.qty, stock or 0, held,
      record.order_no)
  end
  call('ZREM', holds_key, id)
  set_lasting(record_key, record_text('C', record.qty, nonce, record.aux, record.order_no), window,
    true)
  CONFIRMED[2], CONFIRMED[3], CONFIRMED[6], CONFIRMED[7], CONFIRMED[8] =
    stock or -1, record.order_no, record.expires, released, held_for(record, now)
  return CONFIRMED
end

return confirm(KEYS, ARGV)
