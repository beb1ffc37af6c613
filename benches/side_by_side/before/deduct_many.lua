#!lua
--@common
local stock_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3]
local window_arg, max_arg, missing, replicate = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = #KEYS - 3
if n < 0 or #ARGV ~= 5 + 3 * n then
  return badcall('a coalesced DEDUCT takes 3 + n keys and 5 + 3n arguments')
end
local window = window_ms(window_arg)
if not window then
  return badcall('retry window must be at least 60000 ms')
end
if missing ~= 'error' and missing ~= 'zero' then
  return badcall('missing-stock mode must be "error" or "zero"')
end
if not hold_keys_follow(stock_key, holds_key, held_key) then
  return badcall('keys do not follow the stockgate key layout')
end
local journal_key = ARGV[5] == '1' and stock_key .. ':journal'
if n > 0 then
  if journal_key and redis.call('EXISTS', journal_key) == 0 then
    return redis.error_reply(NOJOURNAL)
  end
end
local late = bad_replicate(replicate)
local max_qty = positive_int(max_arg)
if not late and not max_qty then
  late = badcall('max qty must be a positive integer')
end
if n == 0 then
  return {}
end
local read = redis.call('MGET', stock_key, held_key, unpack(KEYS, 4))
local stock = parse_stock(read[1])
local held = tonumber(read[2]) or 0
local record_prefix = stock_key .. ':req:'
local replies = {}
local written = {}
local releasing = held > 0 and stock ~= nil
local released_at = nil
local owed = 0
local decr_failed = nil
local deducted_once = false
for i = 1, n do
  local record_key = KEYS[3 + i]
  local qty_arg, order_no, nonce = ARGV[3 + 3 * i], ARGV[4 + 3 * i], ARGV[5 + 3 * i]
  local reply
  local qty = positive_int(qty_arg)
  if not record_key_under(record_prefix, record_key) then
    reply = badcall('keys do not follow the stockgate key layout')
  elseif type(nonce) ~= 'string' or not string.match(nonce, '^%x+$') or #nonce > 32 then
    reply = badcall('the call nonce must be 1 to 32 hex digits')
  elseif late then
    reply = late
  elseif not qty or qty > max_qty then
    reply = answer(3, nil, '', 'qty must be an integer from 1 to ' .. tostring(max_arg))
  elseif type(order_no) ~= 'string' or #order_no > 128 or string.find(order_no, '[^ -~]') then
    reply = answer(3, nil, '', 'order_no must be at most 128 printable ASCII bytes')
  elseif stock == false then
    reply = redis.error_reply(BADSTOCK)
  else
    local raw = written[record_key] or read[2 + i] or nil
    local record = raw and parse_record(raw)
    if raw and not record then
      reply = redis.error_reply(BADRECORD)
    else
      local released = 0
      if releasing then
        if released_at then
          local earliest = earliest_hold(holds_key)
          releasing = earliest ~= 0 and earliest <= released_at
        end
        if releasing then
          if owed > 0 then
            redis.call('DECRBY', stock_key, owed)
            owed = 0
          end
          local before = stock
          stock, released, released_at = release_due(stock_key, holds_key, held_key, stock, held,
            window, journal_key)
          held = held - (stock - before)
          releasing = held > 0
          if stock ~= before then
            deducted_once = false
          end
        end
      end
      if record then
        if record.state == 'R' or record.state == 'V' then
          replicate_again(replicate, record_key)
          reply = answer(4, stock, '', '', 0, released)
        elseif record.state ~= 'D' then
          reply = answer(3, stock, '', 'request_id holds units on this sku (HOLD); CONFIRM or REVERT it', 0, released)
        elseif record.qty ~= qty_arg then
          reply = answer(3, stock, '', 'request_id was already used with qty ' .. record.qty .. ' on this sku', 0, released)
        else
          replicate_again(replicate, record_key)
          reply = answer(record.nonce == nonce and 0 or 1, stock, record.order_no, '', 0, released)
        end
      elseif stock == nil then
        if missing == 'zero' then
          reply = answer(2, 0)
        else
          reply = redis.error_reply(UNKNOWNSKU)
        end
      elseif stock < qty then
        reply = answer(2, stock, '', '', 0, released, 0, '', math.max(held, 0))
      elseif decr_failed then
        reply = decr_failed
      else
        if deducted_once then
          owed = owed + qty
          stock = stock - qty
        else
          local remain = redis.pcall('DECRBY', stock_key, qty_arg)
          if type(remain) == 'table' then
            decr_failed = remain
          else
            deducted_once = true
            stock = remain
          end
        end
        if decr_failed then
          reply = decr_failed
        else
          if journal_key then
            journal(journal_key, 'deduct', record_key:sub(#record_prefix + 1),
              '-' .. qty_arg, '0', stock, held > 0 and held or 0, order_no)
          end
          local text = record_text('D', qty_arg, nonce, '', order_no)
          redis.call('SET', record_key, text, 'PX', window_arg)
          written[record_key] = text
          reply = answer(0, stock, order_no, '', 0, released)
        end
      end
    end
  end
  replies[i] = reply
  if stock and (stock > EXACT or stock < -EXACT) then
    stock = false
  end
end
if owed > 0 then
  redis.call('DECRBY', stock_key, owed)
end
return replies
