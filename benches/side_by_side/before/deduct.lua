#!lua
--@common
local stock_key, record_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local qty_arg, order_no, window_arg, max_arg, missing, nonce, replicate =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local function invalid(reason, stock)
  return answer(3, stock, '', reason)
end
local window, bad = own_args(KEYS, window_arg, missing, nonce)
if not window then
  return bad
end
bad = bad_replicate(replicate)
if bad then
  return bad
end
local journal_key = ARGV[8] == '1' and stock_key .. ':journal'
local max_qty = positive_int(max_arg)
if not max_qty then
  return badcall('max qty must be a positive integer')
end
local qty = positive_int(qty_arg)
if not qty or qty > max_qty then
  return invalid('qty must be an integer from 1 to ' .. tostring(max_arg))
end
if type(order_no) ~= 'string' or #order_no > 128 or string.find(order_no, '[^ -~]') then
  return invalid('order_no must be at most 128 printable ASCII bytes')
end
local stock, raw, held = read_request(stock_key, record_key, held_key)
if stock == false then
  return redis.error_reply(BADSTOCK)
end
local record = raw and parse_record(raw)
if raw and not record then
  return redis.error_reply(BADRECORD)
end
if journal_key and held > 0 and redis.call('EXISTS', journal_key) == 0 then
  return redis.error_reply(NOJOURNAL)
end
local released
local before = stock
stock, released = release_due(stock_key, holds_key, held_key, stock, held, window, journal_key)
if released > 0 then
  held = held - (stock - before)
end
if record then
  if record.state == 'R' or record.state == 'V' then
    replicate_again(replicate, record_key)
    return answer(4, stock, '', '', 0, released)
  end
  if record.state ~= 'D' then
    return answer(3, stock, '', 'request_id holds units on this sku (HOLD); CONFIRM or REVERT it', 0, released)
  end
  if record.qty ~= qty_arg then
    return answer(3, stock, '', 'request_id was already used with qty ' .. record.qty .. ' on this sku', 0, released)
  end
  replicate_again(replicate, record_key)
  if record.nonce == nonce then
    return answer(0, stock, record.order_no, '', 0, released)
  end
  return answer(1, stock, record.order_no, '', 0, released)
end
if stock == nil then
  if missing == 'zero' then
    return answer(2, 0)
  end
  return redis.error_reply(UNKNOWNSKU)
end
if stock < qty then
  return answer(2, stock, '', '', 0, released, 0, '', math.max(held, 0))
end
if journal_key and not redis.call('XADD', journal_key, 'NOMKSTREAM', '*', 'e',
    journal_entry('deduct', record_key:sub(#stock_key + 6), '-' .. qty_arg, '0', stock - qty,
      held > 0 and held or 0, order_no)) then
  return redis.error_reply(NOJOURNAL)
end
local remain = redis.call('DECRBY', stock_key, qty_arg)
redis.call('SET', record_key, record_text('D', qty_arg, nonce, '', order_no), 'PX', window_arg)
return answer(0, remain, order_no, '', 0, released)
