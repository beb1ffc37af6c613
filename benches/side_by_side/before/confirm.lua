#!lua
--@common
local stock_key, record_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local missing, nonce, replicate = ARGV[2], ARGV[3], ARGV[4]
local function held_for(record, now)
  return math.max(0, now - record.held_at)
end
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
local failed, stock, raw, record, _, released, now = open_request(KEYS, window, journal_key)
if failed then
  return failed
end
if stock == nil and missing ~= 'zero' then
  return redis.error_reply(UNKNOWNSKU)
end
if not record then
  redis.call('SET', record_key, record_text('V', '0', nonce, '', ''), 'PX', window)
  return answer(4, stock, '', '', 0, released)
end
if now == 0 then
  now = now_ms()
end
local own
record, own = release_own(stock_key, holds_key, held_key, record_key, record, now, window,
    journal_key)
if own == 1 then
  stock = (stock or 0) + tonumber(record.qty)
  released = released + 1
end
local state = record.state
if state == 'X' then
  if own == 0 then
    replicate_again(replicate, record_key)
  end
  return answer(5, stock, record.order_no, '', record.expires, released)
end
if state == 'R' or state == 'V' then
  replicate_again(replicate, record_key)
  return answer(4, stock, '', '', 0, released)
end
if state == 'D' then
  return answer(3, stock, '', 'request_id was used by a DEDUCT, which needs no CONFIRM', 0, released)
end
if state == 'C' then
  replicate_again(replicate, record_key)
  if record.nonce == nonce then
    return answer(0, stock, record.order_no, '', record.expires, released,
      held_for(record, now), 'confirmed')
  end
  return answer(1, stock, record.order_no, '', record.expires, released)
end
local held = unhold(held_key, record.qty)
local id = string.sub(record_key, #stock_key + 6)
if journal_key then
  journal(journal_key, 'confirm', id, '0', '-' .. record.qty, stock or 0, held,
    record.order_no)
end
redis.call('ZREM', holds_key, id)
set_lasting(record_key, record_text('C', record.qty, nonce, record.aux, record.order_no), window)
return answer(0, stock, record.order_no, '', record.expires, released, held_for(record, now),
  'confirmed')
