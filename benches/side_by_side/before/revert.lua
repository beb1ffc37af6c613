#!lua
--@common
local stock_key, record_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local missing, nonce, replicate = ARGV[2], ARGV[3], ARGV[4]
local window, bad = own_args(KEYS, ARGV[1], missing, nonce)
if not window then
  return bad
end
bad = bad_replicate(replicate)
if bad then
  return bad
end
local journal_key = ARGV[5] == '1' and stock_key .. ':journal'
if journal_key and redis.call('EXISTS', journal_key) == 0 then
  return redis.error_reply(NOJOURNAL)
end
local failed, stock, raw, record, held, released, now = open_request(KEYS, window, journal_key)
if failed then
  return failed
end
if stock == nil and missing ~= 'zero' and (not record or record.state == 'D'
    or record.state == 'H' or record.state == 'C') then
  return redis.error_reply(UNKNOWNSKU)
end
local own = 0
if not record then
  redis.call('SET', record_key, record_text('V', '0', nonce, '', ''), 'PX', window)
  return answer(4, stock, '', '', 0, released)
end
if record.state == 'H' then
  if now == 0 then
    now = now_ms()
  end
  record, own = release_own(stock_key, holds_key, held_key, record_key, record, now, window,
    journal_key)
  if own == 1 then
    stock = (stock or 0) + tonumber(record.qty)
    released = released + 1
  end
end
if record.state == 'R' then
  replicate_again(replicate, record_key)
  local code = record.nonce == nonce and 0 or 1
  return answer(code, stock, record.order_no, '', 0, released)
end
if record.state == 'V' then
  replicate_again(replicate, record_key)
  local code = record.nonce == nonce and 4 or 1
  return answer(code, stock, '', '', 0, released)
end
if record.state == 'X' then
  if own == 0 then
    replicate_again(replicate, record_key)
  end
  return answer(1, stock, record.order_no, '', record.expires, released)
end
local remain = redis.call('INCRBY', stock_key, record.qty)
local id = string.sub(record_key, #stock_key + 6)
local event = ''
if record.state == 'H' then
  held = unhold(held_key, record.qty)
  redis.call('ZREM', holds_key, id)
  event = 'cancelled'
  if journal_key then
    journal(journal_key, 'cancel', id, record.qty, '-' .. record.qty, remain, held,
      record.order_no)
  end
elseif journal_key then
  journal(journal_key, 'revert', id, record.qty, '0', remain, math.max(held or 0, 0),
    record.order_no)
end
set_lasting(record_key, record_text('R', record.qty, nonce, '', record.order_no), window)
return answer(0, remain, record.order_no, '', 0, released, 0, event)
