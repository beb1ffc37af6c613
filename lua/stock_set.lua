#!lua
--[[
stockgate STOCK.SET: set one SKU's stock, once per op_id, atomically.

A SET sent twice is not harmless: deductions that ran between the first
one and its resend would be overwritten, and the units they took sold
again. So, as STOCK.ADD, each SET names itself with an op_id and is
applied at most once per op_id within the retry window.

KEYS[1]  stock key   <prefix>:{<sku>}
KEYS[2]  op record   <prefix>:{<sku>}:op:<op_id>   "3:S:<qty>:<nonce>:<qty>:"
KEYS[3..6]  the SKU's holds, held units, journal marker, journal (see lua/deduct.lua)
ARGV[1]  qty         decimal integer from 0 to 2^53 - 1
ARGV[2]  retry window   milliseconds, at least 60000: the op record's TTL
ARGV[3]  nonce       1 to 32 hex digits, new for every call
ARGV[4]  replicate   "1" with --wait-replicas, "0" (or absent): a reply for an
                     op_id already applied writes its record again unchanged,
                     so the WAIT after it confirms it (lua/common.lua)
ARGV[5]  journal     "1" with --journal (lua/common.lua, journal_of); a set journals a `set` entry,
                     where the SKU's account starts again

Replies, the shape of DEDUCT's: {code, stock, "", VERSION[, reason]}
  {0, qty, "", VERSION}      set now (a call sent again that finds its own
                             nonce answers 0)
  {1, stock, "", VERSION}    this op_id was already applied; nothing changed
  {3, stock, "", VERSION, reason}  invalid: a bad qty, or the op_id already
                             used with another change
Error replies (nothing changed): BADCALL, BADRECORD.
]]

--@common

local function stock_set(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, op_key = KEYS[1], KEYS[2]
  local qty_arg, nonce = ARGV[1], ARGV[3]

  local window, bad = own_op_args(KEYS, ARGV[2], nonce)
  if not window then
    return bad
  end
  bad = bad_replicate(ARGV[4])
  if bad then
    return bad
  end
  local qty = nil
  if qty_arg and (qty_arg == '0' or positive_int(qty_arg)) then
    qty = to_number(qty_arg)
  end
  if not qty or qty > EXACT then
    return {3, -1, '', VERSION, 'stock must be an integer from 0 to 2^53 - 1'}
  end

  local current = call('GET', stock_key)
  if current == LOCATED then
    return {3, -1, '', VERSION, NAME_LOCATION}
  end
  -- After the refusal above: a SKU kept by location gets no journal from
  -- a change it refuses (an import's row among them).
  local journal_key, refused = journal_of(ARGV[5] == '1')
  if refused then
    return refused
  end
  local shown = to_number(current or '') or -1
  local raw = call('GET', op_key)
  if raw then
    local op = parse_op(raw)
    if not op then
      return error_reply(BADRECORD)
    end
    if op.kind ~= 'S' or op.amount ~= qty_arg then
      return {3, shown, '', VERSION, 'op_id was already used for another change on this sku'}
    end
    replicate_again(ARGV[4] == '1', op_key)
    return {op.nonce == nonce and 0 or 1, shown, '', VERSION}
  end

  -- The held units, for the journal's entry.
  local held = journal_key and to_number(call('GET', held_name) or '0')
  call('SET', stock_key, qty_arg)
  if journal_key then
    local before = to_number(current or '0') or 0
    journal(journal_key, 'set', sub(op_key, #stock_key + 5), int_text(qty - before), '0',
      qty, held, '')
  end
  call('SET', op_key, op_text('S', qty_arg, nonce, qty_arg), 'PX', window)
  return {0, qty, '', VERSION}
end

return stock_set(KEYS, ARGV)
