#!lua flags=allow-cross-slot-keys
--@common
local key = KEYS[1]
local op, window_arg, nonce = ARGV[1], ARGV[2], ARGV[3]
local window = window_ms(window_arg)
if not window then
  return badcall('retry window must be at least 60000 ms')
end
if type(nonce) ~= 'string' or not string.match(nonce, '^%x+$') or #nonce > 32 then
  return badcall('the call nonce must be 1 to 32 hex digits')
end
if KEYS[2] or not string.match(key, ':{order:[!-z|~]+}:intent$') then
  return badcall('keys do not follow the stockgate key layout')
end
local now = now_ms()
local filing_op, orders, filing_arg = ARGV[8], ARGV[9], ARGV[10]
local id, filed, filing = nil, nil, 0
if filing_op == 'file' or filing_op == 'unfile' then
  id = string.match(key, '{order:([^}]+)}:intent$')
  if op == 'read' or type(orders) ~= 'string' or not string.match(orders, ':{[^}]+}:orders$')
      or not positive_int(filing_arg) then
    return badcall('a filing needs the orders key and a number')
  end
  filed = tonumber(redis.call('ZSCORE', orders, id) or '0')
elseif filing_op and filing_op ~= '' then
  return badcall('unknown filing op')
end
if filing_op == 'file' then
  filing = math.max(now + tonumber(filing_arg), filed + 1)
  redis.call('ZADD', orders, filing, id)
end
local fields = redis.call('HMGET', key, 'p', 'k', 'l', 'e', 'c', 's', 'w')
local p, k, l, e, c, s, w = fields[1], fields[2], fields[3], fields[4], fields[5], fields[6], fields[7]
local rests = {DONE = true, HELD = true, ABORTED = true, REVERTED = true, REVOKED = true}
local function reply(changed)
  if filing_op == 'unfile' and rests[p] and filed == tonumber(filing_arg) then
    redis.call('ZREM', orders, id)
    filing = 1
  end
  return {changed, p or '', k or '', l or '', tonumber(e or '0'), tonumber(c or '0'), s or '',
          now, VERSION, filing}
end
local function last(ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
local function write(phase, code, short)
  p, w = phase, nonce
  redis.call('HSET', key, 'p', phase, 'w', nonce)
  if code then
    c, s = code, short or ''
    redis.call('HSET', key, 'c', code, 's', s)
  end
  last(2 * window)
end
local function revoke()
  p, k, l, e, c, s, w = 'REVOKED', '', '', '0', '4', '', nonce
  redis.call('HSET', key, 'p', p, 'k', k, 'l', l, 'e', e, 'c', c, 's', s, 'w', w)
  redis.call('PEXPIRE', key, 2 * window)
end
if op == 'read' then
  return reply(0)
end
if op == 'begin' then
  local kind, lines, ttl, line_ttl = ARGV[4], ARGV[5], positive_int(ARGV[6]) or 0, positive_int(ARGV[7])
  if (kind ~= 'T' and kind ~= 'H' and kind ~= 'D') or type(lines) ~= 'string' or lines == '' or not line_ttl then
    return badcall('begin needs a kind, lines and a line ttl')
  end
  if p then
    last(line_ttl + 2 * window)
    return reply(0)
  end
  p, k, l, c, s, w = 'HOLDING', kind, lines, '0', '', nonce
  e = '0'
  if kind == 'H' then
    e = int_text(now + ttl)
  end
  redis.call('HSET', key, 'p', p, 'k', k, 'l', l, 'e', e, 'c', c, 's', s, 'w', w)
  redis.call('PEXPIRE', key, line_ttl + 2 * window)
  return reply(1)
end
if op == 'advance' then
  local from, to, code, short = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
  if not from or not to then
    return badcall('advance needs from and to')
  end
  if p == from then
    if to == 'HELD' and now >= tonumber(e or '0') then
      write('ABORTING', '5', '')
    elseif to == 'ABORTING' then
      write(to, code or '0', short)
    else
      write(to)
    end
    return reply(1)
  end
  if p == to and w == nonce then
    return reply(1)
  end
  return reply(0)
end
if op == 'confirm' then
  if not p then
    revoke()
    return reply(1)
  end
  if p == 'HELD' then
    if now < tonumber(e) then
      write('CONFIRMING')
    else
      write('ABORTING', '5', '')
    end
    return reply(1)
  end
  return reply(w == nonce and 1 or 0)
end
if op == 'revert' then
  if not p then
    revoke()
    return reply(1)
  end
  if p == 'HELD' and now >= tonumber(e) then
    write('ABORTING', '5', '')
    return reply(0)
  end
  if p == 'HOLDING' or p == 'HELD' or p == 'CONFIRMING' or p == 'DONE' then
    write('REVERTING')
    return reply(1)
  end
  return reply(w == nonce and 1 or 0)
end
return badcall('unknown op')
