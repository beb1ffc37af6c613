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
KEYS[7]  locations           <prefix>:{<sku>}:loc: for a SKU kept by location
                             (lua/common.lua), whose hold's units leave the
                             held units of the locations its record names
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
Error replies (nothing changed): BADCALL, UNKNOWNSKU, BADSTOCK, BADRECORD,
LOCGONE (a location the record names is missing from the SKU's hash).
]]

--@common

-- The words of its settings, and their shape (ARGV[1], lua/common.lua: settle).
local SETTINGS = {'window', 'missing'}
local SETTINGS_SHAPE = '^(%S+) (%S+) (%S+)$'

-- The reply of a hold confirmed (answer's shape: nothing after
-- "confirmed" to leave off), one table made once (for a library), set by
-- each call. Redis reads a function's reply before the next call runs.
local CONFIRMED = {0, 0, '', VERSION, '', 0, 0, 0, 'confirmed'}

local function confirm(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, record_key, nonce = KEYS[1], KEYS[2], ARGV[2]

  local settings, refused = enter(KEYS, ARGV[1], SETTINGS, SETTINGS_SHAPE, nonce, true)
  if not settings then
    return refused
  end
  local window, journal_on = settings.window, settings.journal
  local missing_zero = settings.missing_zero
  local holds_key, held_key = holds_name, held_name

  -- The read, the stored data's checks and the SKU's expired holds given
  -- back, before anything is decided.
  local failed, stock, _, record, _, released, now, journal_key, locs =
    open_request(stock_key, record_key, window, journal_on, open_located)
  if failed then
    return failed
  end
  if stock == nil and not missing_zero then
    return error_reply(UNKNOWNSKU)
  end

  local reply
  reply, record, stock, released, now = step_request('confirm', stock_key, record_key, record,
    nonce, stock, released, now, settings, journal_key, locs)
  if reply then
    return reply
  end

  -- HELD, in time. Writes: only after every check above has passed.
  local id = sub(record_key, #req_prefix + 1)
  if locs then
    -- The units leave each location's held units.
    local list = allocation_of(record.alloc)
    if not all_present(locs, list) then
      return error_reply(LOCGONE)
    end
    for i = 1, #list do
      move(loc_name, locs, list[i][1], 0, -list[i][2], journal_key, 'confirm', id,
        record.order_no)
    end
    unhold(held_key, record.qty)
    call('ZREM', holds_key, id)
    set_lasting(record_key, located_text(list, 'C', record.qty, nonce, record.aux,
      record.order_no), window, true)
    return answer(0, stock, record.order_no, '', record.expires, released,
      held_for(record, now), 'confirmed')
  end
  local held = unhold(held_key, record.qty)
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
