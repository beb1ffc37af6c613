#!lua flags=no-writes
--[[
stockgate STOCK.STATUS: the state of one request, for reconciliation and
support. Reads only (the no-writes flag lets Redis run it anywhere).

KEYS[1]  stock key           <prefix>:{<sku>}
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id>

Replies: {state, qty, order_no, ttl_ms, stock}
  state     "none", "DEDUCTED", "REVERTED" or "REVOKED"
  qty       the qty of the DEDUCT (0 for none and REVOKED)
  order_no  the DEDUCT's order_no ("" for none and REVOKED)
  ttl_ms    the record's remaining TTL in milliseconds (-2 for none)
  stock     the SKU's current stock, as stored ("" when missing)
Error replies: BADRECORD ... when the record has an unknown shape.
]]

--@common

local names = {D = 'DEDUCTED', R = 'REVERTED', V = 'REVOKED'}
local stock = redis.call('GET', KEYS[1]) or ''
local record = redis.call('GET', KEYS[2])
if not record then
  return {'none', 0, '', -2, stock}
end
local parsed = parse_record(record)
if not parsed then
  return redis.error_reply(BADRECORD)
end
return {names[parsed.state], tonumber(parsed.qty), parsed.order_no, redis.call('PTTL', KEYS[2]), stock}
