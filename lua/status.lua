#!lua
--[[
stockgate STOCK.STATUS: the state of one request and of its SKU, for
reconciliation and support. Like every call on a SKU it first gives the
SKU's expired holds back to stock (the request's own hold too, when it ran
out), so what it shows is what Redis time says, not what was swept.

KEYS[1]  stock key           <prefix>:{<sku>}
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id>
KEYS[3..6]          the SKU's holds, held units, journal marker, journal (see lua/deduct.lua)
ARGV[1]  retry window, milliseconds, at least 60000 (a released record's TTL)
ARGV[2]  journal, "1" with --journal (lua/common.lua, journal_of: a release journals `expire` entries)

Replies: {state, qty, order_no, ttl_ms, stock, held, next_expiry, expires_at, released}
  state        "none", "DEDUCTED", "REVERTED", "REVOKED", "HELD",
               "CONFIRMED" or "EXPIRED"
  qty          the request's qty (0 for none and REVOKED)
  order_no     its order_no ("" for none and REVOKED)
  ttl_ms       the record's remaining TTL in milliseconds (-2 for none, -1
               for HELD: a held record lasts until its hold ends)
  stock        the SKU's available stock, as stored ("" when missing)
  held         the SKU's units on hold now
  next_expiry  the earliest expiry among the SKU's holds (ms of Redis time;
               0 when it has none)
  expires_at   the request's hold expiry (HELD, CONFIRMED, EXPIRED; else 0)
  released     expired holds this call gave back to stock
Error replies: BADRECORD ... when the record has an unknown shape (a record
made by allocation on a SKU whose stock is a number included), BADCALL
when the keys do not follow the layout or the window is missing, LOCATED
for a SKU kept by location (nothing changed: stockgate asks
lua/allocate.lua "status", which answers this shape with the SKU's total).
]]

--@common

local function status(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, record_key = KEYS[1], KEYS[2]
  sku_keys(stock_key)
  if not keys_follow_layout(record_key) or not side_keys_follow(KEYS, 3) then
    return badcall('keys do not follow the stockgate key layout')
  end
  local holds_key, held_key = holds_name, held_name
  local window = window_ms(ARGV[1])
  if not window then
    return badcall('retry window must be at least 60000 ms')
  end
  local journal_key, refused = journal_of(ARGV[2] == '1')
  if refused then
    return refused
  end
  local stock, raw, held, stored = read_request(stock_key, record_key, held_key)
  if stored == LOCATED then
    return error_reply(LOCATEDSKU)
  end
  local record = raw and parse_record(raw)
  if raw and not record then
    return error_reply(BADRECORD)
  end
  local released, now = 0, 0
  if stock then
    stock, released, now = release_due(stock_key, holds_key, held_key, stock, held, window,
      journal_key)
    if record and record.state == 'H' then
      if now == 0 then
        now = now_ms()
      end
      local _
      record, _, _, released = release_own(stock_key, holds_key, held_key, record_key, record,
        now, window, journal_key, nil, released)
    end
  end
  local shown = call('GET', stock_key) or ''
  held = to_number(call('GET', held_key) or '0')
  local next_expiry = earliest_hold(holds_key)
  if not record then
    return {'none', 0, '', -2, shown, held, next_expiry, 0, released}
  end
  return {STATE_NAMES[record.state], to_number(record.qty), record.order_no,
          call('PTTL', record_key), shown, held, next_expiry, record.expires, released}
end

return status(KEYS, ARGV)
