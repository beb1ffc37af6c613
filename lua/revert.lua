#!lua
--[[
stockgate REVERT.

Gives back what one request deducted or holds, at most once, atomically;
and guards against the two hazards of compensation (as in TCC / Seata):
  empty rollback  a REVERT arrives for a DEDUCT (or HOLD) that never
                  happened: it is recorded as REVOKED and gives nothing back;
  hanging         a DEDUCT or HOLD arrives after its REVERT: REVOKED (or
                  REVERTED) refuses it with code 4 (see lua/deduct.lua).

Each (sku, request_id) is a small state machine kept in its idempotency
record (format in lua/common.lua), with a TTL of at least the retry window
from its last change, but for a HELD record, which has none: a hold's
units are known from its record alone, so it lasts until the hold ends
(CONFIRM, REVERT, or the release at its expiry), which gives it its
window. The whole machine,
every command against every state (lua/hold.lua and lua/confirm.lua hold
their columns):

  state now  DEDUCT          HOLD              CONFIRM            REVERT
  none       ->DEDUCTED 0    ->HELD 0          ->REVOKED 4        ->REVOKED 4
             (2 when short)  (2 when short)    (UNKNOWNSKU: *)    (UNKNOWNSKU: *)
  DEDUCTED   1 (3: other     3 (a DEDUCT's     3                  give back
             qty)            id)                                  ->REVERTED 0
  HELD       3 (a hold's id) 1 (3: other qty)  ->CONFIRMED 0      give back
                                                                  ->REVERTED 0
  HELD, ran  3               ->EXPIRED 5       ->EXPIRED 5        ->EXPIRED 1
  out **
  CONFIRMED  3               1 (3: other qty)  1                  give back
                                                                  ->REVERTED 0
  EXPIRED    3               5                 5                  1
  REVERTED   4               4                 4                  1
  REVOKED    4               4                 4                  1

  *  when the sku has no stock key and --missing-stock is "error"
  ** a hold whose expiry (Redis time) has passed, whether or not anything
     has released it yet: the call releases it first, so it answers by
     the clock, not by the sweeper

The qty given back is read from the record, never from the caller. A
REVERTED or REVOKED record lasts a full retry window from the REVERT, and
no update shortens a record's TTL. Every read and check that can fail
happens before the first write. A call sent again after its connection was
lost finds its own nonce in the record and answers what it answered the
first time (0 given back, 4 revoked), not 1. Every call first gives the
SKU's expired holds back to stock (lua/common.lua, release_due).

KEYS[1]  stock key           <prefix>:{<sku>}
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id>
KEYS[3..6]          the SKU's holds, held units, journal marker, journal (see lua/deduct.lua)
KEYS[7]  locations           <prefix>:{<sku>}:loc: for a SKU kept by location
                             (lua/common.lua), whose request's units go back
                             to the locations its record names
ARGV[1]  settings            "<window> <missing> <flags>" (lua/deduct.lua
                             ARGV[3]): with replicate on, a reply stating an
                             existing record (0 and 4 for a call sent again,
                             1) writes it again unchanged, so the WAIT after
                             it confirms it (lua/common.lua); journal: an
                             entry per change
ARGV[2]  nonce               1 to 32 hex digits, new for every call

Replies, DEDUCT's shape (lua/common.lua, answer()):
  {0, remain, order_no, ...}   given back; remain is the stock after it,
                               order_no the one the DEDUCT or HOLD stored
  {1, stock, order_no, ...}    duplicate: already reverted (order_no of the
                               DEDUCT) or already revoked (""), or a hold
                               that expired (its units went back then);
                               nothing changed
  {4, stock, "", ...}          revoked: nothing had been deducted or held;
                               the id is now refused by DEDUCT and HOLD
(stock is -1 where it was not read or the stock key is missing.)
Error replies (nothing changed):
  BADCALL ...     an argument stockgate supplies is wrong (ARGV, the keys)
  UNKNOWNSKU ...  the stock key does not exist and missing is "error": a
                  REVERT naming a sku with no stock is far likelier a wrong
                  sku than an empty rollback, and answering 4 ("nothing to
                  give back") would let the real deduction go unreturned
  BADSTOCK ...    the stock value is not an integer
  BADRECORD ...   the record has a shape this version can't read
  LOCGONE ...     a location the record names is missing from the SKU's
                  locations hash (deleted behind stockgate's back)
]]

--@common

-- The words of its settings, and their shape (ARGV[1], lua/common.lua: settle).
local SETTINGS = {'window', 'missing'}
local SETTINGS_SHAPE = '^(%S+) (%S+) (%S+)$'

-- The reply of a deduction given back with nothing released (answer's
-- shape): one table, made once (for a library), its remain and order_no
-- set by each call. Redis reads a function's reply before the next call
-- runs.
local REVERTED = {0, 0, '', VERSION}

local function revert(KEYS, ARGV)
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
  local failed, stock, _, record, held, released, now, journal_key, locs =
    open_request(stock_key, record_key, window, journal_on, open_located)
  if failed then
    return failed
  end
  if stock == nil and not missing_zero and (not record or record.state == 'D'
      or record.state == 'H' or record.state == 'C') then
    return error_reply(UNKNOWNSKU)
  end
  local reply
  reply, record, stock, released = step_request('revert', stock_key, record_key, record, nonce,
    stock, released, now, settings, journal_key, locs)
  if reply then
    return reply
  end

  -- DEDUCTED, HELD (in time) or CONFIRMED: give the units back.
  -- Writes: only after every check above has passed.
  local state = record.state
  local id = sub(record_key, #req_prefix + 1)
  local event = state == 'H' and 'cancelled' or ''
  if locs then
    -- Every unit back where it came from.
    local list = allocation_of(record.alloc)
    if not all_present(locs, list) then
      return error_reply(LOCGONE)
    end
    for i = 1, #list do
      move(loc_name, locs, list[i][1], list[i][2], state == 'H' and -list[i][2] or 0,
        journal_key, state == 'H' and 'cancel' or 'revert', id, record.order_no)
    end
    if state == 'H' then
      unhold(held_key, record.qty)
      call('ZREM', holds_key, id)
    end
    set_lasting(record_key, located_text(list, 'R', record.qty, nonce, '', record.order_no),
      window, state == 'H')
    return answer(0, total_of(locs), record.order_no, '', 0, released, 0, event)
  end
  local remain = call('INCRBY', stock_key, record.qty)
  if state == 'H' then
    held = unhold(held_key, record.qty)
    call('ZREM', holds_key, id)
    if journal_key then
      journal(journal_key, 'cancel', id, record.qty, '-' .. record.qty, remain, held,
        record.order_no)
    end
  elseif journal_key then
    journal(journal_key, 'revert', id, record.qty, '0', remain, held > 0 and held or 0,
      record.order_no)
  end
  set_lasting(record_key, record_text('R', record.qty, nonce, '', record.order_no), window,
    state == 'H')
  if released == 0 and event == '' then
    REVERTED[2], REVERTED[3] = remain, record.order_no
    return REVERTED
  end
  return answer(0, remain, record.order_no, '', 0, released, 0, event)
end

return revert(KEYS, ARGV)
