#!lua
--@common
local stock_key, record_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local qty_arg, order_no, ttl_arg, max_hold_arg, window_arg, max_arg, missing, nonce, replicate =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local window, bad = own_args(KEYS, window_arg, missing, nonce)
if not window then
  return bad
end
bad = bad_replicate(replicate)
if bad then
  return bad
end
local journal_key = ARGV[10] == '1' and stock_key .. ':journal'
if journal_key and redis.call('EXISTS', journal_key) == 0 then
  return redis.error_reply(NOJOURNAL)
end
local max_qty = positive_int(max_arg)
local max_hold = positive_int(max_hold_arg)
if not max_qty or not max_hold or max_hold < 1000 then
  return badcall('max qty and max hold must be positive integers, max hold at least 1000')
end
local qty = positive_int(qty_arg)
if not qty or qty > max_qty then
  return answer(3, -1, '', 'qty must be an integer from 1 to ' .. max_arg)
end
if type(order_no) ~= 'string' or #order_no > 128 or string.find(order_no, '[^ -~]') then
  return answer(3, -1, '', 'order_no must be at most 128 printable ASCII bytes')
end
local ttl = positive_int(ttl_arg)
if not ttl or ttl < 1000 or ttl > max_hold then
  return answer(3, -1, '', 'ttl_ms must be an integer from 1000 to ' .. max_hold_arg)
end
local failed, stock, raw, record, _, released, now = open_request(KEYS, window, journal_key)
if failed then
  return failed
end
if stock == nil and missing ~= 'zero' then
  return redis.error_reply(UNKNOWNSKU)
end
if now == 0 then
  now = now_ms()
end
if record then
  local own
  record, own = release_own(stock_key, holds_key, held_key, record_key, record, now, window,
    journal_key)
  if own == 1 then
    stock = (stock or 0) + tonumber(record.qty)
    released = released + 1
  end
  local state = record.state
  if state == 'R' or state == 'V' then
    replicate_again(replicate, record_key)
    return answer(4, stock, '', '', 0, released)
  end
  if state == 'D' then
    return answer(3, stock, '', 'request_id was used by a DEDUCT on this sku', 0, released)
  end
  if state == 'X' then
    if own == 0 then
      replicate_again(replicate, record_key)
    end
    return answer(5, stock, record.order_no, '', record.expires, released)
  end
  if record.qty ~= qty_arg then
    return answer(3, stock, '', 'request_id was already used with qty ' .. record.qty .. ' on this sku', 0, released)
  end
  replicate_again(replicate, record_key)
  if record.nonce == nonce and state == 'H' then
    return answer(0, stock, record.order_no, '', record.expires, released, 0, 'placed')
  end
  return answer(1, stock, record.order_no, '', record.expires, released)
end
if stock == nil then
  return answer(2, 0, '', '', 0, released)
end
if stock < qty then
  return answer(2, stock, '', '', 0, released)
end
local expires = now + ttl
local remain = redis.call('DECRBY', stock_key, qty)
local held = redis.call('INCRBY', held_key, qty)
local id = string.sub(record_key, #stock_key + 6)
if journal_key then
  journal(journal_key, 'hold', id, '-' .. qty_arg, qty_arg, remain, held, order_no)
end
redis.call('ZADD', holds_key, expires, id)
redis.call('SET', record_key,
  record_text('H', qty_arg, nonce, int_text(expires) .. '.' .. int_text(now), order_no))
return answer(0, remain, order_no, '', expires, released, 0, 'placed')
