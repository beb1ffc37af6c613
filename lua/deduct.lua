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
KEYS[5]  journal marker      <prefix>:{<sku>}:journal:on       "1" while the SKU has a journal
KEYS[6]  journal             <prefix>:{<sku>}:journal          stream (lua/common.lua, journal)
The script uses the names it makes from the stock key (lua/common.lua,
sku_keys) and checks these against them; they are declared so that a
cluster checks them before the call runs (lua/common.lua, request_fault).

ARGV[1]  qty                 decimal integer from 1 to max qty
ARGV[2]  order_no            0 to 128 printable ASCII bytes ("" when none)
ARGV[3]  settings            "<window> <max qty> <missing> <flags>", one word
                             each, e.g. "86400000 1000000 error 00": what
                             stockgate supplies alike for every call, one
                             argument (lua/common.lua, settle):
         window              retry window, milliseconds, at least 60000: the
                             record's TTL
         max qty             decimal integer
         missing             missing stock: "error" or "zero"
         flags               "<replicate><journal>", "0" or "1" each:
         replicate           "1" with --wait-replicas: a reply stating an
                             existing record (0 for a call sent again, 1, 4)
                             then writes it again unchanged, so the WAIT
                             after it confirms that record (replicate_again
                             in lua/common.lua)
         journal             "1" with --journal. A SKU that has a journal
                             gets the change's entry in this call whatever
                             the flag (lua/common.lua, journal_of); with
                             "1", a call that would change a SKU without one
                             is refused with NOJOURNAL, nothing changed
ARGV[4]  nonce               1 to 32 hex digits, new for every call

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
  BADCALL ...     an argument stockgate supplies is wrong (ARGV[3], ARGV[4],
                  the keys)
  UNKNOWNSKU ...  the stock key does not exist and missing is "error"
  BADSTOCK ...    the stock value is not an integer within +-(2^53 - 1)
  BADRECORD ...   the idempotency record has a shape this version can't read

A duplicate never refreshes the record's TTL: the retry window counts from
the deduction, not from the latest retry (with replicate on it writes the
record again with the same absolute expiry).
]]

--@common

-- The reply of the commonest answer of all, a 0 with nothing released: one
-- table, made once (for a library), its remain and order_no set by each
-- call. Redis reads a function's reply before the next call runs.
local DEDUCTED = {0, 0, '', VERSION}

-- The words of its settings, and their shape (ARGV[3], lua/common.lua: settle).
local SETTINGS = {'window', 'max_qty', 'missing'}
local SETTINGS_SHAPE = '^(%S+) (%S+) (%S+) (%S+)$'

-- A DEDUCT, written out: the hot path calls no helper it does not need
-- (a call on a SKU without holds reads once, writes twice, and answers
-- with the one reply table lua/common.lua keeps for it).
local function deduct(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, record_key = KEYS[1], KEYS[2]
  local qty_arg, order_no, nonce = ARGV[1], ARGV[2], ARGV[4]

  -- stockgate's own arguments (lua/common.lua: a library checks a
  -- settings text once, not on every call).
  local settings = SETTLED[ARGV[3]]
  if not settings then
    local bad
    settings, bad = settle(ARGV[3], SETTINGS, SETTINGS_SHAPE)
    if bad then
      return bad
    end
  end
  local bad = request_fault(KEYS, nonce)
  if bad then
    return bad
  end
  local window, replicate, journal_on = settings.window, settings.replicate, settings.journal

  -- The caller's (stockgate has already checked them too).
  local qty = known_qty_n
  if qty_arg ~= known_qty then
    qty = qty_of(qty_arg)
  end
  if not qty or qty > settings.max_qty then
    return answer(3, nil, '', 'qty must be an integer from 1 to ' .. settings.max_arg)
  end
  if not order_no or #order_no > 128 or find(order_no, '[^ -~]') then
    return answer(3, nil, '', 'order_no must be at most 128 printable ASCII bytes')
  end

  -- The read and the stored data's checks (lua/common.lua's open_request,
  -- written out: most DEDUCTs find no holds to give back).
  local got = call('MGET', stock_key, record_key, held_name, marker_name)
  local stock, raw, held = parse_stock(got[1]), got[2], got[3]
  if stock == false then
    return error_reply(got[1] == LOCATED and LOCATEDSKU or BADSTOCK)
  end
  held = held and to_number(held) or 0
  local record = raw and parse_record(raw)
  if raw and not record then
    return error_reply(BADRECORD)
  end

  -- The journal, by its marker (lua/common.lua, journal_of), matters
  -- where the call would change the SKU: before a release of expired
  -- holds, which journals, and at the deduction's own entry. A DEDUCT
  -- that changes nothing needs no journal, and with --journal is not
  -- refused for want of one.
  local journal_key = got[4] and journal_name
  local released = 0
  if held > 0 then
    if journal_on and not journal_key then
      return error_reply(NOJOURNAL)
    end
    local _, units
    stock, released, _, units = release_due(stock_key, holds_name, held_name, stock, held, window,
      journal_key)
    if released > 0 then
      -- What went back to stock is no longer held (the units counted: the
      -- stock's difference is a double's, rounded past 2^53).
      held = held - units
    end
  end

  -- Idempotency: a known request_id never deducts again.
  if record then
    local state = record.state
    if state == 'R' or state == 'V' then
      replicate_again(replicate, record_key)
      return answer(4, stock, '', '', 0, released)
    end
    if state ~= 'D' then
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
    if settings.missing_zero then
      return answer(2, 0)
    end
    return error_reply(UNKNOWNSKU)
  end
  if stock < qty then
    return answer(2, stock, '', '', 0, released, 0, '', held > 0 and held or 0)
  end

  -- Writes: only after every check above has passed. The arguments go to
  -- Redis as the strings they came as (checked canonical above): a Lua
  -- number passed to redis.call is formatted with snprintf, about 2.7k
  -- instructions each. The entry goes first, so that a SKU whose journal
  -- is gone is refused having changed nothing; it states the stock after
  -- the DECRBY that follows, computed here (exact: within +-(2^53 - 1)).
  if journal_on and not journal_key then
    return error_reply(NOJOURNAL)
  end
  if journal_key and not call('XADD', journal_key, 'NOMKSTREAM', '*', 'e',
      journal_entry('deduct', sub(record_key, #req_prefix + 1), '-' .. qty_arg, '0',
        stock - qty, held > 0 and held or 0, order_no)) and journal_on then
    return error_reply(NOJOURNAL)
  end
  local remain = call('DECRBY', stock_key, qty_arg)
  call('SET', record_key, record_text('D', qty_arg, nonce, '', order_no), 'PX',
    settings.window_arg)
  if released > 0 then
    return answer(0, remain, order_no, '', 0, released)
  end
  DEDUCTED[2], DEDUCTED[3] = remain, order_no
  return DEDUCTED
end

return deduct(KEYS, ARGV)
