#!lua flags=allow-cross-slot-keys
--[[
stockgate ORDER: one order's intent record.

An order (ORDER, ORDER.HOLD) is a saga over per-line HOLDs, one per SKU,
each on its own primary; this script keeps the one record that says how
far the saga got, so that any stockgate (a retry, a concurrent attempt, or
the next one after a crash) can resume it. Every change is a
compare-and-set here: of two stockgates racing on one order, exactly one
moves it on, and the other follows what the record then says.

Phases (the record's field p):
  HOLDING     lines are being held (ORDER.HOLD) or taken (ORDER); some
              may be placed already
  HELD        ORDER.HOLD only: every line holds until e (Redis time here)
  CONFIRMING  the commit point of an ORDER.HOLD: lines are being confirmed
  DONE        every line confirmed (ORDER.HOLD) or taken (ORDER): deducted
              for good
  ABORTING    lines are being given back (c: why, 2 short, 4 revoked,
              5 expired, 3 a line refused; s: the SKUs at fault)
  ABORTED     every line given back or revoked; c and s as above
  REVERTING   ORDER.REVERT: lines are being given back
  REVERTED    every line given back or revoked
  REVOKED     an ORDER.REVERT (or ORDER.CONFIRM) came first: nothing was
              ever held, and a late ORDER / ORDER.HOLD of the id gets 4

The record is a hash with a TTL: p phase, k kind (T for ORDER, whose
lines are DEDUCTs; H for ORDER.HOLD; D for an ORDER begun by an older
stockgate, whose lines are held, then confirmed), l the canonical line set ("sku qty sku qty ...", sorted by
sku), e the order hold's expiry (ms of Redis time; 0 for ORDER), b when
an ORDER.HOLD began (Redis time; absent from intents an older stockgate
began), c and s, w the nonce of the call that wrote it last (a call sent
again finds its own nonce and is told it made the change), and one
field x:<change_id> per ORDER.EXTEND applied, "<ttl_ms> <expiry it set>
<nonce>". Its TTL is never
shortened, and always outlasts the line records it speaks for: the line
holds' ttl plus two retry windows at begin (renewed by each attempt), at
least two retry windows from any change; an extension renews it to the
lines' new expiry plus two retry windows.

KEYS[1]  intent  <prefix>:{order:<request_id>}:intent
ARGV[1]  op      begin | advance | confirm | revert | read | try_extend |
                 extend
ARGV[2]  retry window, milliseconds, at least 60000
ARGV[3]  nonce   1 to 32 hex digits, new for every attempt
begin:   ARGV[4] kind (T, H or D), ARGV[5] lines, ARGV[6] ttl_ms (H; else 0),
         ARGV[7] line ttl ms (how long the line holds last; T: the saga's)
advance: ARGV[4] from, ARGV[5] to, ARGV[6] code, ARGV[7] short; to HELD
         after e has passed goes to ABORTING with code 5 instead
confirm: ARGV[4] the lines the request named ("" for none): when named
         and not l, nothing moves; else HELD before e -> CONFIRMING, at
         or after e -> ABORTING (5); no record -> REVOKED
revert:  no record -> REVOKED; HOLDING, HELD (before e), CONFIRMING, DONE
         -> REVERTING; HELD at or after e -> ABORTING (5)
try_extend: ARGV[4] change_id, ARGV[5] ttl_ms, ARGV[6] how long an order
         may hold from b (ms); changes nothing, answers what an extend
         would (the outcome below), its new expiry now + ttl_ms
extend:  ARGV[4] change_id, ARGV[5] ttl_ms, ARGV[6] the new expiry
         try_extend answered, ARGV[7] how much longer the lines hold (ms):
         the compare-and-set of an ORDER.EXTEND, once its lines hold that
         long. HELD before e and the new expiry later than e: e moves to
         it, x:<change_id> is recorded. Either op, by what it finds:
           x:<change_id> recorded  1 and its expiry (0 when it is this call
                                   sent again; 3 with another ttl_ms)
           none                    3    k not H          3
           HOLDING                 3 (not held yet)
           HELD, before e          0 (3: past b + ARGV[6], no b, or not
                                   later than e)
           HELD, at or after e     5    CONFIRMING, DONE 1
           ABORTING, ABORTED       5 when c is 5, else 4
           REVERTING, REVERTED, REVOKED  4

The order's filing among the orders in flight (lua/order_due.lua) may
ride along, so that an order costs no call of its own for it: ARGV[8]
`file`, ARGV[9] the orders key of the intent's shard, ARGV[10] after_ms
files the order as order_due's `mark` does, before the op (any op but
read); ARGV[8] `unfile`, ARGV[9] the orders key, ARGV[10] the score it
was filed at takes it out as order_due's `done` does, after the op, and
only when the order then rests (DONE, HELD, ABORTED, REVERTED, REVOKED).
The orders key is of another slot: the script is flagged
allow-cross-slot-keys and touches it before any other write (a filing's
ZADD is the call's first write; taking out reads its ZSCORE first), so
when it lives on another node (or is migrating away) the call fails with
"non local key" having changed nothing, and stockgate files with
order_due instead.
Unused ARGV before ARGV[8] are "".

Reply: {changed, p, k, l, e, c, s, now, VERSION, filing} and, for
try_extend and extend only, {outcome, expiry, reason}: the code the
extension answers, the order's expiry it answers with (the new one for
0 and a recorded change's 1), why for a 3. changed is 1
when this call (or this call sent again) made the change, p is "" when
there is no record; now is Redis time where the call decides an expiry
(a begin, a filing, an ORDER.HOLD's or a HELD order's calls), else 0; filing is the score the order was filed at (file),
1 when it was taken out (unfile), else 0. Errors: BADCALL for what
stockgate supplies.
]]

--@common

-- The phases an order rests in: nothing moves it on but a command.
local RESTS = {DONE = true, HELD = true, ABORTED = true, REVERTED = true, REVOKED = true}

-- The call in hand: its intent key, nonce and window, the record's fields
-- as read and then as written (p, k, l, e, c, s, w), Redis time (0 where
-- no expiry is decided), and the filing that rides along. Set at the
-- start of every call, before anything reads them: Redis runs one call at
-- a time, and a table or closures per call would cost more.
local key, nonce, window, now
local p, k, l, e, c, s, w, b
local filing_op, orders, filing_arg, id, filed, filing

-- The reply, one table made once: {changed, p, k, l, e, c, s, now,
-- VERSION, filing}.
local REPLY = {0, '', '', '', 0, 0, '', 0, VERSION, 0}

local function reply(changed)
  -- As order_due's done: only the filing this attempt made, and only
  -- once the order rests.
  if filing_op == 'unfile' and RESTS[p] and filed == to_number(filing_arg) then
    call('ZREM', orders, id)
    filing = 1
  end
  REPLY[1], REPLY[2], REPLY[3], REPLY[4] = changed, p or '', k or '', l or ''
  -- Most orders have no expiry and no code: "0" read as 0 without
  -- tonumber.
  REPLY[5] = (e == '0' or not e) and 0 or to_number(e)
  REPLY[6] = (c == '0' or not c) and 0 or to_number(c)
  REPLY[7], REPLY[8], REPLY[10] = s or '', now, filing
  return REPLY
end

-- The orders keys a filing named that had the shape of one: a shard's
-- sixteen, checked once each (for a library); a handful more are let go.
local ORDERS_KEYS, orders_keys = {}, 0

-- TTLs as text, for PEXPIRE: a number given to redis.call costs Lua a
-- formatting (about 2k instructions), and these are the same on every
-- call of one stockgate (for a library).
local TTL_TEXTS, ttl_texts = {}, 0

local function ttl_text(ms)
  local text = TTL_TEXTS[ms]
  if not text then
    if ttl_texts >= 16 then
      TTL_TEXTS, ttl_texts = {}, 0
    end
    text = int_text(ms)
    TTL_TEXTS[ms], ttl_texts = text, ttl_texts + 1
  end
  return text
end

-- At least `ms` from now; never shorter than it was.
local function last(ms)
  if call('PTTL', key) < ms then
    call('PEXPIRE', key, ttl_text(ms))
  end
end

local function write(phase, code, short)
  p, w = phase, nonce
  if code then
    c, s = code, short or ''
    call('HSET', key, 'p', phase, 'w', nonce, 'c', c, 's', s)
  else
    call('HSET', key, 'p', phase, 'w', nonce)
  end
  last(2 * window)
end

local function revoke()
  p, k, l, e, c, s, w = 'REVOKED', '', '', '0', '4', '', nonce
  call('HSET', key, 'p', p, 'k', k, 'l', l, 'e', e, 'c', c, 's', s, 'w', w)
  call('PEXPIRE', key, ttl_text(2 * window))
end

-- An extension's reply: the intent's, then its outcome.
local function extended(changed, outcome, expiry, reason)
  REPLY[11], REPLY[12], REPLY[13] = outcome, expiry, reason or ''
  return reply(changed)
end

-- try_extend (dry) and extend: see the header.
local function extend(dry, change_id, ttl_arg, arg6, arg7)
  local ttl, number = positive_int(ttl_arg), positive_int(arg6)
  if not change_id or change_id == '' or not ttl or not number
      or (not dry and not positive_int(arg7)) then
    return badcall('an extension needs a change_id, a ttl and a number')
  end
  local field = 'x:' .. change_id
  local done = p and call('HGET', key, field)
  if done then
    local was_ttl, was_expiry, was_nonce = match(done, '^(%d+) (%d+) (%x+)$')
    if not was_ttl then
      return badcall('the intent holds an extension stockgate did not write')
    end
    if was_ttl ~= ttl_arg then
      return extended(0, 3, 0, 'change_id was already used for another change of this order')
    end
    if was_nonce == nonce and not dry then
      return extended(1, 0, to_number(was_expiry))
    end
    return extended(0, 1, to_number(was_expiry))
  end
  if not p then
    return extended(0, 3, 0, 'no order under this request_id')
  end
  -- A revoked order has no kind: nothing was ever held.
  if p == 'REVOKED' then
    return extended(0, 4, 0)
  end
  if k ~= 'H' then
    return extended(0, 3, 0, k == 'T' and "request_id is an ORDER's, which holds no time"
      or "request_id is an ORDER an older stockgate began, which holds no time of its own")
  end
  if p == 'CONFIRMING' or p == 'DONE' then
    return extended(0, 1, to_number(e))
  end
  if p == 'ABORTING' or p == 'ABORTED' then
    return extended(0, c == '5' and 5 or 4, c == '5' and to_number(e) or 0)
  end
  if p ~= 'HELD' and p ~= 'HOLDING' then
    return extended(0, 4, 0)
  end
  if p == 'HOLDING' then
    return extended(0, 3, 0,
      'the order is not held yet: its ORDER.HOLD has not finished (send that again first)')
  end
  local expiry = to_number(e)
  if now >= expiry then
    return extended(0, 5, expiry)
  end
  if not b then
    return extended(0, 3, 0, 'the order was held by an older stockgate, which kept no start '
      .. 'time to bound an extension by: it lasts until its expiry')
  end
  local target = number
  if dry then
    target = now + ttl
    local bound = to_number(b) + number
    if target > bound then
      return extended(0, 3, 0, 'the order may last until ' .. int_text(bound) .. ' at most ('
        .. arg6 .. ' ms from its start)')
    end
  end
  if target <= expiry then
    return extended(0, 3, 0, 'the order already lasts until ' .. e
      .. ': an extension only moves it later')
  end
  if dry then
    return extended(0, 0, target)
  end
  e = int_text(target)
  call('HSET', key, 'e', e, field, ttl_arg .. ' ' .. e .. ' ' .. nonce)
  last(target - now + to_number(arg7) + 2 * window)
  return extended(1, 0, target)
end

local function order(KEYS, ARGV)
  if not call then
    bind()
  end
  local op = ARGV[1]
  key, nonce = KEYS[1], ARGV[3]
  window = window_ms(ARGV[2])
  if not window then
    return badcall('retry window must be at least 60000 ms')
  end
  if not nonce_ok(nonce) then
    return badcall('the call nonce must be 1 to 32 hex digits')
  end
  -- "<...>:{order:<id>}:intent", the id printable and without braces:
  -- found plainly, then matched from where it starts (a pattern left to
  -- find its own start tries every position of the key).
  local at = find(key, ':{order:', 1, true)
  if KEYS[2] or not at or not find(key, '^[!-z|~]+}:intent$', at + 8) then
    return badcall('keys do not follow the stockgate key layout')
  end

  -- The filing that rides along. Taking it out reads the orders key
  -- first, and filing writes it first: a key of another node fails the
  -- call there, before anything is written.
  filing_op, orders, filing_arg = ARGV[8], ARGV[9], ARGV[10]
  id, filed, filing = nil, nil, 0
  if filing_op == 'file' or filing_op == 'unfile' then
    id = sub(key, at + 8, -9)
    if op == 'read' or not orders or not positive_int(filing_arg) then
      return badcall('a filing needs the orders key and a number')
    end
    if not ORDERS_KEYS[orders] then
      if not find(orders, ':{[^}]+}:orders$') then
        return badcall('a filing needs the orders key and a number')
      end
      if orders_keys >= 64 then
        ORDERS_KEYS, orders_keys = {}, 0
      end
      ORDERS_KEYS[orders], orders_keys = true, orders_keys + 1
    end
    if filing_op == 'unfile' then
      filed = to_number(call('ZSCORE', orders, id) or '0')
    end
  elseif filing_op and filing_op ~= '' then
    return badcall('unknown filing op')
  end

  -- A begin asks only whether the record is there (most often it is not,
  -- and the begin writes every field); any other op reads them all.
  p, k, l, e, c, s, w, b = nil, nil, nil, nil, nil, nil, nil, nil
  REPLY[11], REPLY[12], REPLY[13] = nil, nil, nil
  if op ~= 'begin' or call('HEXISTS', key, 'p') == 1 then
    local fields = call('HMGET', key, 'p', 'k', 'l', 'e', 'c', 's', 'w', 'b')
    p, k, l, e, c, s, w = fields[1], fields[2], fields[3], fields[4], fields[5], fields[6], fields[7]
    b = fields[8]
  end
  -- Redis time decides the filing's due time and an ORDER.HOLD's expiry;
  -- an ORDER (kind T) has no expiry, and its other calls need none.
  now = 0
  if op == 'begin' or filing_op == 'file' or (k and k ~= 'T') or p == 'HELD' then
    now = now_ms()
  end
  if filing_op == 'file' then
    -- As order_due's mark: after any filing before it. GT: an earlier
    -- filing at or after this one's time is left (CH: 0), and this one
    -- goes right after it.
    filing = now + to_number(filing_arg)
    if call('ZADD', orders, 'GT', 'CH', filing, id) == 0 then
      filing = to_number(call('ZSCORE', orders, id)) + 1
      call('ZADD', orders, filing, id)
    end
  end

  if op == 'read' then
    return reply(0)
  end

  if op == 'begin' then
    local kind, lines, ttl, line_ttl = ARGV[4], ARGV[5], positive_int(ARGV[6]) or 0, positive_int(ARGV[7])
    if (kind ~= 'T' and kind ~= 'H' and kind ~= 'D') or not lines or lines == '' or not line_ttl then
      return badcall('begin needs a kind, lines and a line ttl')
    end
    if p then
      last(line_ttl + 2 * window)
      return reply(0)
    end
    p, k, l, c, s, w = 'HOLDING', kind, lines, '0', '', nonce
    e = '0'
    if kind == 'H' then
      e, b = int_text(now + ttl), int_text(now)
      call('HSET', key, 'p', p, 'k', k, 'l', l, 'e', e, 'c', c, 's', s, 'w', w, 'b', b)
    else
      call('HSET', key, 'p', p, 'k', k, 'l', l, 'e', e, 'c', c, 's', s, 'w', w)
    end
    call('PEXPIRE', key, ttl_text(line_ttl + 2 * window))
    return reply(1)
  end

  if op == 'advance' then
    local from, to, code, short = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
    if not from or not to then
      return badcall('advance needs from and to')
    end
    if p == from then
      if to == 'HELD' and now >= to_number(e or '0') then
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
    -- Lines named that are not the order's: the request was ordered on
    -- its connection by those SKUs, so it may not touch others.
    local named = ARGV[4]
    if named and named ~= '' and named ~= l then
      return reply(0)
    end
    if p == 'HELD' then
      if now < to_number(e) then
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
    if p == 'HELD' and now >= to_number(e) then
      write('ABORTING', '5', '')
      return reply(0)
    end
    if p == 'HOLDING' or p == 'HELD' or p == 'CONFIRMING' or p == 'DONE' then
      write('REVERTING')
      return reply(1)
    end
    return reply(w == nonce and 1 or 0)
  end

  if op == 'try_extend' or op == 'extend' then
    return extend(op == 'try_extend', ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  end

  return badcall('unknown op')
end

return order(KEYS, ARGV)
