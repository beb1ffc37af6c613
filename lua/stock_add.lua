#!lua
--[[
stockgate STOCK.ADD: change one SKU's stock by a signed delta, once per
op_id, atomically, never below 0. A missing stock key counts as 0
(restocking a new SKU).

An operator's change is as retry-prone as an order's: a reply lost after the
change ran, and a resend (by stockgate's fallback client, by redis-rs after
a dropped connection, or by the operator's tool) would add the stock twice,
and phantom stock is overselling. So each change names itself with an
op_id, recorded like an order's request_id, and a change is applied at most
once per op_id within the retry window.

KEYS[1]  stock key   <prefix>:{<sku>}
KEYS[2]  op record   <prefix>:{<sku>}:op:<op_id>   "3:A:<delta>:<nonce>:<after>:"
KEYS[3..6]  the SKU's holds, held units, journal marker, journal (see lua/deduct.lua)
ARGV[1]  delta       signed decimal integer, |delta| <= 2^53 - 1
ARGV[2]  retry window   milliseconds, at least 60000: the op record's TTL
ARGV[3]  nonce       1 to 32 hex digits, new for every call
ARGV[4]  replicate   "1" with --wait-replicas, "0" (or absent): a reply for an
                     op_id already applied writes its record again unchanged,
                     so the WAIT after it confirms it (lua/common.lua)
ARGV[5]  journal     "1" with --journal (lua/common.lua, journal_of): an `add` entry

Replies, the shape of DEDUCT's: {code, stock, "", VERSION[, reason]}
  {0, after, "", VERSION}    added now; after is the stock after it (a call
                             sent again that finds its own nonce answers 0)
  {1, stock, "", VERSION}    this op_id was already applied; nothing changed
  {2, stock, "", VERSION}    refused: the stock would go below 0; nothing changed
  {3, stock, "", VERSION, reason}  invalid: a bad delta, the op_id already
                             used with another change, or a stock past 2^53 - 1
Error replies (nothing changed): BADCALL (stockgate's own arguments),
BADSTOCK (the stock value is not an integer), BADRECORD (an op record of
an unknown shape).
]]

--@common

local function stock_add(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, op_key = KEYS[1], KEYS[2]
  local delta_arg, nonce = ARGV[1], ARGV[3]

  local window, bad = own_op_args(KEYS, ARGV[2], nonce)
  if not window then
    return bad
  end
  bad = bad_replicate(ARGV[4])
  if bad then
    return bad
  end
  local delta = nil
  if delta_arg and #delta_arg <= 17 and find(delta_arg, '^%-?%d+$') then
    delta = to_number(delta_arg)
  end
  if not delta or delta > EXACT or delta < -EXACT then
    return {3, -1, '', VERSION, 'delta must be an integer within +-(2^53 - 1)'}
  end

  local raw_stock = call('GET', stock_key)
  local stock = parse_stock(raw_stock)
  if raw_stock == LOCATED then
    return {3, -1, '', VERSION, NAME_LOCATION}
  end
  if stock == false then
    return error_reply(BADSTOCK)
  end
  -- After the refusals above, as in lua/stock_set.lua.
  local journal_key, refused = journal_of(ARGV[5] == '1')
  if refused then
    return refused
  end

  local raw = call('GET', op_key)
  if raw then
    local op = parse_op(raw)
    if not op then
      return error_reply(BADRECORD)
    end
    if op.kind ~= 'A' or op.amount ~= delta_arg then
      return {3, stock or -1, '', VERSION, 'op_id was already used for another change on this sku'}
    end
    replicate_again(ARGV[4] == '1', op_key)
    return {op.nonce == nonce and 0 or 1, stock or 0, '', VERSION}
  end

  local after = (stock or 0) + delta
  if after < 0 then
    return {2, stock or 0, '', VERSION}
  end
  if after > EXACT then
    return {3, stock or 0, '', VERSION, 'the stock would exceed 2^53 - 1'}
  end
  -- Read before the first write, as in lua/stock_set.lua.
  local held = journal_key and to_number(call('GET', held_name) or '0')
  after = call('INCRBY', stock_key, delta_arg)
  if journal_key then
    journal(journal_key, 'add', sub(op_key, #stock_key + 5), delta_arg, '0', after, held, '')
  end
  call('SET', op_key, op_text('A', delta_arg, nonce, int_text(after)), 'PX', window)
  return {0, after, '', VERSION}
end

return stock_add(KEYS, ARGV)
