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

An order's line (request_id `~ord:<order id>`, which only stockgate's
ORDER.EXTEND saga sends: src/stock/order/extend.rs) is extended with the
six keys of its request and no change record: the order's intent records
the change (lua/order.lua), and a line's extension needs none, for it is
"at least until now + ttl_ms": past the line's bound it ends at the bound
(its ORDER.HOLD's line holds stop at --max-hold likewise), and one not
later than the line lasts already answers 1 with the expiry it has and
changes nothing. Sent twice, it is as sent once a little later. A shrink
of an order's line is 3: an order's lines change by ORDER commands only.

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
KEYS[3..6]          the SKU's holds, held units, journal marker, journal (see lua/deduct.lua)
KEYS[7]  locations           <prefix>:{<sku>}:loc: for a SKU kept by location
                             (lua/common.lua): a shrink gives units back to
                             the locations the record names, the last taken
                             first
KEYS[8]  change record       <prefix>:{<sku>}:chg:<change_id> (none for an
                             order's line)
         "3:<kind>:<amount>:<nonce>:<expires_at>:<request_id>", kind E
         (extend) or S (shrink), expires_at the hold's expiry after it
ARGV[1]  kind                "extend" or "shrink"
ARGV[2]  amount              extend: ttl_ms, 1000 to max hold;
                             shrink: qty, 1 to max qty
ARGV[3]  settings            HOLD's, "<max hold> <window> <max qty> <missing>
                             <flags>" (lua/hold.lua ARGV[4]): the retry
                             window is the change record's TTL
ARGV[4]  nonce               1 to 32 hex digits, new for every call

Replies (lua/common.lua, answer()): {code, stock, order_no, VERSION,
reason, expires_at, released, held_ms, event}, as HOLD's:
  {0, stock, order_no, .., "", expires_at, released, 0, event}
        changed now (event "extended" or "shrunk"); stock after it
  {1, stock, order_no, .., "", expires_at}   this change_id was applied
        (expires_at as it set it); or an extension of a confirmed hold
  {3, stock, "", .., reason}                 invalid; nothing changed
  {4, stock, "", ..}                         reverted or revoked
  {5, stock, order_no, .., "", expires_at}   the hold ran out
Error replies (nothing changed): BADCALL, UNKNOWNSKU, BADSTOCK, BADRECORD,
LOCGONE (a location the record names is missing from the SKU's hash).
]]

--@common

-- The words of its settings, and their shape (ARGV[3], lua/common.lua:
-- settle): HOLD's, so one settings text serves both.
local SETTINGS = {'max_hold', 'window', 'max_qty', 'missing'}
local SETTINGS_SHAPE = '^(%S+) (%S+) (%S+) (%S+) (%S+)$'

-- The letter of each kind in a change record.
local LETTERS = {extend = 'E', shrink = 'S'}

-- The request_id prefix of an order's lines (src/keys.rs,
-- ORDER_LINE_PREFIX).
local ORDER_LINE = '~ord:'

-- A request's keys and its SKU's locations hash, for request_fault, which
-- takes them alone (KEYS[8] is the change's record): one table made once,
-- filled by each call.
local REQUEST_KEYS = {}

local function change_hold(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, record_key, change_key = KEYS[1], KEYS[2], KEYS[8]
  local kind, amount_arg, nonce = ARGV[1], ARGV[2], ARGV[4]

  for i = 1, 7 do
    REQUEST_KEYS[i] = KEYS[i]
  end
  local settings, refused = enter(REQUEST_KEYS, ARGV[3], SETTINGS, SETTINGS_SHAPE, nonce, true)
  if not settings then
    return refused
  end
  local letter = LETTERS[kind]
  if not letter then
    return badcall('kind must be extend or shrink')
  end
  local order_line = sub(record_key, #req_prefix + 1, #req_prefix + #ORDER_LINE) == ORDER_LINE
  if order_line then
    if change_key then
      return badcall('keys do not follow the stockgate key layout')
    end
    if letter ~= 'E' then
      return answer(3, -1, '', "an order's lines change by ORDER commands only")
    end
  elseif not change_key or KEYS[9] or not record_key_under(stock_key .. ':chg:', change_key) then
    return badcall('keys do not follow the stockgate key layout')
  end
  local window, replicate, journal_on = settings.window, settings.replicate, settings.journal
  local holds_key, held_key = holds_name, held_name

  local amount = positive_int(amount_arg)
  if letter == 'E' and (not amount or amount < 1000 or amount > settings.max_hold) then
    return answer(3, -1, '', 'ttl_ms must be an integer from 1000 to ' .. settings.max_hold_arg)
  end
  if letter == 'S' and (not amount or amount > settings.max_qty) then
    return answer(3, -1, '', 'qty must be an integer from 1 to ' .. settings.max_arg)
  end

  -- The read, the stored data's checks and the SKU's expired holds given
  -- back, before anything is decided.
  local failed, stock, _, record, _, released, now, journal_key, locs =
    open_request(stock_key, record_key, window, journal_on, open_located)
  if failed then
    return failed
  end
  if stock == nil and not settings.missing_zero then
    return error_reply(UNKNOWNSKU)
  end
  local id = sub(record_key, #req_prefix + 1)

  -- This change_id already applied: its answer again, nothing changed.
  local done = not order_line and call('GET', change_key)
  if done then
    local was, was_amount, was_nonce, was_expires, was_id =
      match(done, '^3:([ES]):(%d+):(%x*):(%d+):(.*)$')
    if not was then
      return error_reply(BADRECORD)
    end
    if was ~= letter or was_amount ~= amount_arg or was_id ~= id then
      return answer(3, stock, '', 'change_id was already used for another change on this sku', 0,
        released)
    end
    replicate_again(replicate, change_key)
    local order_no = record and record.order_no or ''
    if was_nonce == nonce then
      -- This very call, sent again: it changed the hold the first time.
      return answer(0, stock, order_no, '', to_number(was_expires), released, 0,
        letter == 'E' and 'extended' or 'shrunk')
    end
    return answer(1, stock, order_no, '', to_number(was_expires), released)
  end

  -- Only a hold's own expiry needs Redis time here: whether it ran out,
  -- and an extension's new expiry.
  local reply, event
  reply, record, stock, released, now, event = step_request(kind, stock_key, record_key, record,
    nonce, stock, released, now, settings, journal_key, locs)
  if reply then
    return reply
  end

  -- HELD, in time: its new expiry and qty, or why not.
  local expires, qty, reason = changed_hold(kind, record, amount, now, settings, order_line)
  if not expires then
    if qty == 1 then
      -- An order's line that lasts that long already.
      return answer(1, stock, record.order_no, '', record.expires, released)
    end
    return answer(qty, stock, '', reason, 0, released)
  end

  -- Writes: only after every check above has passed.
  local asked = record.asked or record.qty
  local expires_text = int_text(expires)
  local list = locs and allocation_of(record.alloc)
  if list and not all_present(locs, list) then
    return error_reply(LOCGONE)
  end
  if letter == 'E' then
    call('ZADD', holds_key, expires_text, id)
  elseif list then
    -- From the last location taken first.
    local left = amount
    for i = #list, 1, -1 do
      if left > 0 then
        local n = list[i][2] < left and list[i][2] or left
        move(loc_name, locs, list[i][1], n, -n, journal_key, 'cancel', id, record.order_no)
        list[i][2], left = list[i][2] - n, left - n
      end
    end
    local kept = {}
    for i = 1, #list do
      if list[i][2] > 0 then
        kept[#kept + 1] = list[i]
      end
    end
    list = kept
    unhold(held_key, amount_arg)
    stock = total_of(locs)
  else
    stock = call('INCRBY', stock_key, amount_arg)
    local held = unhold(held_key, amount_arg)
    if journal_key then
      journal(journal_key, 'cancel', id, amount_arg, '-' .. amount_arg, stock, held,
        record.order_no)
    end
  end
  local aux = expires_text .. '.' .. int_text(record.held_at)
  if asked ~= qty then
    aux = aux .. '.' .. asked
  end
  -- The hold's record keeps its HOLD's nonce (a HOLD sent again still finds
  -- it) and its lack of a TTL.
  local text = list and located_text(list, 'H', qty, record.nonce, aux, record.order_no)
    or record_text('H', qty, record.nonce, aux, record.order_no)
  call('SET', record_key, text, 'KEEPTTL')
  if not order_line then
    call('SET', change_key,
      '3:' .. letter .. ':' .. amount_arg .. ':' .. nonce .. ':' .. expires_text .. ':' .. id,
      'PX', settings.window_arg)
  end
  return answer(0, stock, record.order_no, '', expires, released, 0, event)
end

return change_hold(KEYS, ARGV)
