local VERSION = 4
local EXACT = 9007199254740991
local function positive_int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^[1-9]%d*$') then
    return nil
  end
  return tonumber(s)
end
local function window_ms(s)
  local window = positive_int(s)
  if not window or window < 60000 then
    return nil
  end
  return window
end
local function record_key_under(prefix, record_key)
  return #record_key > #prefix and string.sub(record_key, 1, #prefix) == prefix
end
local function keys_follow_layout(stock_key, record_key)
  return record_key_under(stock_key .. ':req:', record_key)
end
local function op_key_follows_layout(stock_key, op_key)
  local prefix = stock_key .. ':op:'
  local op_id = string.sub(op_key, #prefix + 1)
  return string.find(stock_key, '{', 1, true) ~= nil
    and string.sub(op_key, 1, #prefix) == prefix
    and #op_id >= 1 and #op_id <= 128
    and not string.find(op_id, '[^!-~]')
    and not string.find(op_id, '[{}]')
end
local function hold_keys_follow(stock_key, holds_key, held_key)
  return holds_key == stock_key .. ':holds' and held_key == stock_key .. ':held'
end
local function badcall(what)
  return redis.error_reply('BADCALL ' .. what .. ' (stockgate supplies it: a version mismatch or a bug); nothing was changed')
end
local function own_args(keys, window_arg, missing, nonce)
  local stock_key, record_key = keys[1], keys[2]
  local window = window_ms(window_arg)
  if not window then
    return nil, badcall('retry window must be at least 60000 ms')
  end
  if missing ~= 'error' and missing ~= 'zero' then
    return nil, badcall('missing-stock mode must be "error" or "zero"')
  end
  if not keys_follow_layout(stock_key, record_key)
    or not hold_keys_follow(stock_key, keys[3], keys[4]) or keys[5] then
    return nil, badcall('keys do not follow the stockgate key layout')
  end
  if type(nonce) ~= 'string' or not string.match(nonce, '^%x+$') or #nonce > 32 then
    return nil, badcall('the call nonce must be 1 to 32 hex digits')
  end
  return window
end
local function own_op_args(stock_key, op_key, window_arg, nonce)
  local window = window_ms(window_arg)
  if not window then
    return nil, badcall('retry window must be at least 60000 ms')
  end
  if not op_key_follows_layout(stock_key, op_key) then
    return nil, badcall('keys do not follow the stockgate key layout')
  end
  if type(nonce) ~= 'string' or not string.match(nonce, '^%x+$') or #nonce > 32 then
    return nil, badcall('the call nonce must be 1 to 32 hex digits')
  end
  return window
end
local function bad_replicate(flag)
  if flag == nil or flag == '0' or flag == '1' then
    return nil
  end
  return badcall('the replicate flag must be "0" or "1"')
end
local function replicate_again(flag, key)
  if flag ~= '1' then
    return
  end
  local raw = redis.call('GET', key)
  if not raw then
    return
  end
  local at = redis.call('PEXPIRETIME', key)
  if at > 0 then
    redis.call('SET', key, raw, 'PXAT', at)
  else
    redis.call('SET', key, raw, 'KEEPTTL')
  end
end
local function parse_stock(raw)
  if not raw then
    return nil
  end
  local n = nil
  if #raw <= 17 and string.match(raw, '^%-?%d+$') then
    n = tonumber(raw)
  end
  if not n or n > EXACT or n < -EXACT then
    return false
  end
  return n
end
local function read_stock(stock_key)
  return parse_stock(redis.call('GET', stock_key))
end
local function read_request(stock_key, record_key, held_key)
  local got = redis.call('MGET', stock_key, record_key, held_key)
  return parse_stock(got[1]), got[2] or nil, tonumber(got[3]) or 0
end
local BADSTOCK = 'BADSTOCK stock value is not an integer; nothing was changed'
local BADRECORD = 'BADRECORD idempotency record has an unknown shape; nothing was changed'
local UNKNOWNSKU = 'UNKNOWNSKU no stock is recorded for this sku; nothing was changed'
local function parse_record(raw)
  local state, qty, nonce, aux, order_no =
    string.match(raw, '^3:([DRVHCX]):(%d+):(%x*):([%d.]*):(.*)$')
  if state then
    local expires, held_at = 0, 0
    if state == 'H' or state == 'C' or state == 'X' then
      local e, h = string.match(aux, '^(%d+)%.(%d+)$')
      if not e then
        return nil
      end
      expires, held_at = tonumber(e), tonumber(h)
    elseif not string.match(aux, '^%d*$') then
      return nil
    end
    return {state = state, qty = qty, nonce = nonce, aux = aux, order_no = order_no,
            expires = expires, held_at = held_at}
  end
  state, qty, order_no = string.match(raw, '^([DRV]):(%d+):(.*)$')
  if state then
    return {state = state, qty = qty, nonce = '', aux = '', order_no = order_no,
            expires = 0, held_at = 0}
  end
  return nil
end
local function record_text(state, qty, nonce, aux, order_no)
  return '3:' .. state .. ':' .. qty .. ':' .. nonce .. ':' .. aux .. ':' .. order_no
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int_text(n)
  return string.format('%d', n)
end
local NOJOURNAL = 'NOJOURNAL the sku has no journal yet; nothing was changed'
local function journal_entry(ev, id, ds, dh, st, hd, ono)
  local after
  if hd == 0 then
    after = ('%d 0 '):format(st)
  else
    after = ('%d %d '):format(st, hd)
  end
  return '1 ' .. ev .. ' ' .. id .. ' ' .. ds .. ' ' .. dh .. ' ' .. after .. (ono or '')
end
local function journal(key, ev, id, ds, dh, st, hd, ono)
  redis.call('XADD', key, '*', 'e', journal_entry(ev, id, ds, dh, st, hd, ono))
end
local RELEASE_BOUND = 32
local function unhold(held_key, qty)
  local left = redis.call('DECRBY', held_key, qty)
  if left <= 0 then
    redis.call('DEL', held_key)
    return 0
  end
  return left
end
local function set_lasting(record_key, text, window)
  if redis.call('PTTL', record_key) > window then
    redis.call('SET', record_key, text, 'KEEPTTL')
  else
    redis.call('SET', record_key, text, 'PX', window)
  end
end
local function release_one(stock_key, holds_key, held_key, record_key, record, window, journal_key)
  local stock = redis.call('INCRBY', stock_key, record.qty)
  local held = unhold(held_key, record.qty)
  local id = record_key:sub(#stock_key + 6)
  if journal_key then
    journal(journal_key, 'expire', id, record.qty, '-' .. record.qty, stock, held,
      record.order_no)
  end
  redis.call('ZREM', holds_key, id)
  set_lasting(record_key,
    record_text('X', record.qty, record.nonce, record.aux, record.order_no), window)
end
local function release_expired(stock_key, holds_key, held_key, now, window, journal_key)
  local due = redis.call('ZRANGEBYSCORE', holds_key, '-inf', now, 'LIMIT', 0, RELEASE_BOUND)
  local released, units = 0, 0
  for _, id in ipairs(due) do
    local record_key = stock_key .. ':req:' .. id
    local raw = redis.call('GET', record_key)
    local record = raw and parse_record(raw)
    if record and record.state == 'H' and record.expires <= now then
      release_one(stock_key, holds_key, held_key, record_key, record, window, journal_key)
      released = released + 1
      units = units + tonumber(record.qty)
    elseif record and record.state == 'H' then
      redis.call('ZADD', holds_key, record.expires, id)
    elseif not raw or record then
      redis.call('ZREM', holds_key, id)
    end
  end
  return released, units
end
local function release_due(stock_key, holds_key, held_key, stock, held, window, journal_key)
  if stock == nil then
    return stock, 0, 0
  end
  if held == nil then
    held = redis.call('EXISTS', holds_key)
  end
  if held <= 0 then
    return stock, 0, 0
  end
  local now = now_ms()
  local released, units = release_expired(stock_key, holds_key, held_key, now, window, journal_key)
  return stock + units, released, now
end
local function open_request(keys, window, journal_key)
  local stock_key, record_key, holds_key, held_key = keys[1], keys[2], keys[3], keys[4]
  local stock, raw, held = read_request(stock_key, record_key, held_key)
  if stock == false then
    return redis.error_reply(BADSTOCK)
  end
  local record = raw and parse_record(raw)
  if raw and not record then
    return redis.error_reply(BADRECORD)
  end
  local before = stock
  local released, now
  stock, released, now = release_due(stock_key, holds_key, held_key, stock, held, window,
    journal_key)
  if released > 0 then
    held = held - (stock - before)
  end
  return nil, stock, raw, record, held, released, now
end
local function release_own(stock_key, holds_key, held_key, record_key, record, now, window,
    journal_key)
  if not record or record.state ~= 'H' or record.expires > now then
    return record, 0
  end
  local raw = redis.call('GET', record_key)
  local fresh = raw and parse_record(raw)
  if not fresh or fresh.state ~= 'H' then
    return fresh, 0
  end
  release_one(stock_key, holds_key, held_key, record_key, fresh, window, journal_key)
  fresh.state = 'X'
  return fresh, 1
end
local function earliest_hold(holds_key)
  local first = redis.call('ZRANGE', holds_key, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2])
  end
  return 0
end
local function answer(code, stock, order_no, reason, expires_at, released, held_ms, event, held)
  if (reason or '') == '' and (expires_at or 0) == 0 and (released or 0) == 0
    and (held_ms or 0) == 0 and (event or '') == '' and (held or 0) == 0 then
    return {code, stock or -1, order_no or '', VERSION}
  end
  local reply = {code, stock or -1, order_no or '', VERSION, reason or '', expires_at or 0,
                 released or 0, held_ms or 0, event or '', held or 0}
  local n = #reply
  while n > 4 and (reply[n] == 0 or reply[n] == '') do
    reply[n] = nil
    n = n - 1
  end
  return reply
end
local function parse_op(raw)
  local kind, amount, nonce, after = string.match(raw, '^3:([AS]):(%-?%d+):(%x*):(%-?%d*):$')
  if not kind then
    return nil
  end
  return {kind = kind, amount = amount, nonce = nonce, after = after}
end
local function op_text(kind, amount, nonce, after)
  if type(after) == 'number' then
    after = string.format('%d', after)
  end
  return '3:' .. kind .. ':' .. amount .. ':' .. nonce .. ':' .. after .. ':'
end
