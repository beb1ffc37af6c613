-- stockgate's shared script helpers. stockgate inserts this file into each
-- script where the script says --@common, so every script applies the same
-- rules; the text Redis runs (and its SHA) includes it.

-- The version of the script set: the fourth element of every reply.
-- 3: records carry the call's nonce; stockgate's own arguments, when
-- wrong, are a BADCALL error, never code 3.
-- 4: holds (HOLD, CONFIRM, code 5), released by Redis time.
local VERSION = 4
-- Lua numbers are doubles: integers beyond 2^53 - 1 lose precision.
local EXACT = 9007199254740991

-- A canonical positive decimal integer ("1", never "01" or "+1"), or nil.
local function positive_int(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^[1-9]%d*$') then
    return nil
  end
  return tonumber(s)
end

-- The retry window in milliseconds, or nil when under a minute.
local function window_ms(s)
  local window = positive_int(s)
  if not window or window < 60000 then
    return nil
  end
  return window
end

-- The record key must be the stock key plus ":req:<request_id>", so the
-- record belongs to the SKU whose stock the call changes (and, in a
-- cluster, shares its slot: the stock key's hash tag is the record key's).
-- That is all a script checks of it: the request_id's own rules (length,
-- printable, no braces) protect no stored data, since the key is the
-- caller's to name and the record under it reads the same whatever the
-- id, and stockgate has checked them before it built the key. (They cost
-- about 10k instructions per call: issue 16, README "Flash sale".)
local function record_key_under(prefix, record_key)
  return #record_key > #prefix and string.sub(record_key, 1, #prefix) == prefix
end

-- Returns true when the record key follows the layout (above).
local function keys_follow_layout(stock_key, record_key)
  return record_key_under(stock_key .. ':req:', record_key)
end

-- An operator's op record key must be the stock key plus ":op:<op_id>".
local function op_key_follows_layout(stock_key, op_key)
  local prefix = stock_key .. ':op:'
  local op_id = string.sub(op_key, #prefix + 1)
  return string.find(stock_key, '{', 1, true) ~= nil
    and string.sub(op_key, 1, #prefix) == prefix
    and #op_id >= 1 and #op_id <= 128
    and not string.find(op_id, '[^!-~]')
    and not string.find(op_id, '[{}]')
end

-- A SKU's holds live beside its stock key: a sorted set of the request_ids
-- holding units, by expiry (milliseconds of Redis time), and the units held
-- now. Returns true when the keys are those of `stock_key`.
local function hold_keys_follow(stock_key, holds_key, held_key)
  return holds_key == stock_key .. ':holds' and held_key == stock_key .. ':held'
end

-- An error for an argument stockgate itself supplies (not the caller): a
-- version mismatch between stockgate and its scripts, or a bug. Never a
-- business code: the caller must not take it for "invalid parameters".
local function badcall(what)
  return redis.error_reply('BADCALL ' .. what .. ' (stockgate supplies it: a version mismatch or a bug); nothing was changed')
end

-- The checks every script on one request (DEDUCT, REVERT, HOLD, CONFIRM)
-- makes of what stockgate supplies: the window, the missing-stock mode,
-- the key layout (KEYS: stock, record, holds, held) and the call's nonce.
-- Returns the window, or nil and the BADCALL error to return.
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

-- The checks STOCK.SET and STOCK.ADD make of what stockgate supplies.
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

-- ARGV "replicate": "1" with --wait-replicas, else "0" (absent reads as
-- "0"). Returns the BADCALL error to return for any other value, or nil.
local function bad_replicate(flag)
  if flag == nil or flag == '0' or flag == '1' then
    return nil
  end
  return badcall('the replicate flag must be "0" or "1"')
end

-- With --wait-replicas, stockgate sends WAIT after the script on the same
-- connection and acknowledges a reply that reports a record (codes 0, 1
-- and 4) only once replicas confirm it. WAIT confirms what *this
-- connection* wrote, and Valkey 8 (unlike Redis 7.0, which waits for the
-- primary's whole stream after any command) tracks that per client: a
-- duplicate that wrote nothing gets an empty confirmation, though the
-- record it reports was written through another connection (another
-- sidecar, the other path of this one) and may be on no replica. So such
-- a reply writes its record again, unchanged and with the same absolute
-- expiry: the replication stream carries it after the original write, and
-- the WAIT that follows covers both. A no-op for the data; off without
-- --wait-replicas. The record is read here, as it is now, not passed in as
-- the call first read it: the call may have changed it since (a late call
-- on a hold that ran out gives back the SKU's holds that ran out, its own
-- among them, before it answers), and writing what it read then would
-- undo that.
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

-- The stock: nil when the key is missing, false when it is not an exact
-- integer, otherwise the number.
-- A stock value as read: nil when the key is missing, false when it is not
-- an exact integer, otherwise the number.
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

-- What a call on one request reads first, in one MGET (the keys share a
-- slot): the stock (as read_stock gives it), the record's raw text (nil
-- when none) and the SKU's units on hold (0 when none). One call instead of
-- three is what keeps a DEDUCT on a SKU without holds as cheap for Redis
-- as it was before holds existed.
local function read_request(stock_key, record_key, held_key)
  local got = redis.call('MGET', stock_key, record_key, held_key)
  return parse_stock(got[1]), got[2] or nil, tonumber(got[3]) or 0
end

local BADSTOCK = 'BADSTOCK stock value is not an integer; nothing was changed'
local BADRECORD = 'BADRECORD idempotency record has an unknown shape; nothing was changed'
local UNKNOWNSKU = 'UNKNOWNSKU no stock is recorded for this sku; nothing was changed'

-- An idempotency record, one string with a TTL. States:
--   D  DEDUCTED   qty units were deducted
--   R  REVERTED   qty units were deducted or held, then given back
--   V  REVOKED    a REVERT (or a CONFIRM) came first (qty 0); this id may
--                 never deduct or hold
--   H  HELD       qty units are on hold until aux's expiry
--   C  CONFIRMED  a hold made final: qty units deducted for good
--   X  EXPIRED    a hold that ran out: its units went back to stock
--
-- Written as "3:<state>:<qty>:<nonce>:<aux>:<order_no>"; aux is empty for
-- D, R and V, and "<expires_at>.<held_at>" (milliseconds of Redis time) for
-- H, C and X, which keep it. A hold that gave some units back (HOLD.SHRINK)
-- holds qty units now and keeps the qty its HOLD asked for as a third part,
-- "<expires_at>.<held_at>.<asked>", so a HOLD sent again still matches. The nonce names the call that wrote it: a call sent again
-- after its connection was lost finds its own nonce and answers what it
-- answered the first time, not "duplicate". Scripts of version 2 and older
-- read only "<state>:<qty>:<order_no>", which stockgate no longer writes;
-- they answer BADRECORD for a version-3 record (an error, never a code)
-- because "3" is no state they know.
--
-- Returns {state, qty (string), nonce, aux, order_no, expires, held_at,
-- asked}, or nil for any other shape. Older records read with an empty
-- nonce and aux; expires and held_at are numbers for H, C and X, else 0;
-- asked (a string) is nil but for a hold that gave units back.
local function parse_record(raw)
  local state, qty, nonce, aux, order_no =
    string.match(raw, '^3:([DRVHCX]):(%d+):(%x*):([%d.]*):(.*)$')
  if state then
    local expires, held_at = 0, 0
    local asked
    if state == 'H' or state == 'C' or state == 'X' then
      local e, h = string.match(aux, '^(%d+)%.(%d+)$')
      if not e then
        -- A hold that gave some of its units back (lua/change_hold.lua)
        -- keeps the qty its HOLD asked for third.
        e, h, asked = string.match(aux, '^(%d+)%.(%d+)%.(%d+)$')
        if not e then
          return nil
        end
      end
      expires, held_at = tonumber(e), tonumber(h)
    elseif not string.match(aux, '^%d*$') then
      -- Version 3 read (and ignored) digits here; so does this one.
      return nil
    end
    return {state = state, qty = qty, nonce = nonce, aux = aux, order_no = order_no,
            expires = expires, held_at = held_at, asked = asked}
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

-- Now, in milliseconds of Redis time: what decides every expiry. Sidecars on
-- many hosts may disagree about the time; Redis does not.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lua 5.1 spells integers past 10^14 as 1e+14: every integer put in a key
-- or a record goes through this.
local function int_text(n)
  return string.format('%d', n)
end

-- The SKU's journal (src/journal/mod.rs owns the entry's shape): every
-- change of a SKU's stock or held units appends one entry, in the call
-- that makes it, to <stock key>:journal when the SKU has a journal,
-- whatever the caller's journal flag. The flag ("1" with --journal) only
-- says that a SKU without one must get one first: such a call is refused
-- with NOJOURNAL having changed nothing, and stockgate lists the SKU in
-- its shard's set of journals, then makes the stream
-- (lua/journal_open.lua), and sends the call again, so the sink finds
-- every journal without a scan. A sidecar with the journal off thus keeps
-- the books of every SKU that has them, beside sidecars with it on (a
-- mixed fleet, a rolling restart that turns the journal on): its changes
-- are never made outside the journal (docs/books.md).
local NOJOURNAL = 'NOJOURNAL the sku has no journal yet; nothing was changed'

-- The key this call journals to: the SKU's journal when it has one, false
-- when it has none and `flag` is not "1"; nil and the NOJOURNAL error to
-- return when it has none and `flag` is "1". Asked first, before anything
-- is read or written.
local function journal_of(stock_key, flag)
  local key = stock_key .. ':journal'
  if redis.call('EXISTS', key) == 1 then
    return key
  end
  if flag == '1' then
    return nil, redis.error_reply(NOJOURNAL)
  end
  return false
end

-- One entry, as one field `e`: "1 <event> <id> <stock change> <held
-- change> <stock after> <held after> <order_no>" (the format version
-- first; the order_no last, as it may hold spaces; the entry's id,
-- <ms>-<seq>, carries Redis time). One field, not nine: an XADD's cost
-- grows with its arguments, and this is on every change (issue 26's
-- budget, docs/performance.md). The changes come as strings, the stock
-- and held units after it as numbers. `string` is reached through the
-- format's own methods: a library function (FCALL) finds each global
-- through a sandbox's lookup, about 0.5k instructions; and "held after"
-- is most often 0, which needs no formatting (0.7k).
local function journal_entry(ev, id, ds, dh, st, hd, ono)
  local after
  if hd == 0 then
    after = ('%d 0 '):format(st)
  else
    after = ('%d %d '):format(st, hd)
  end
  return '1 ' .. ev .. ' ' .. id .. ' ' .. ds .. ' ' .. dh .. ' ' .. after .. (ono or '')
end

-- Appends the entry to the SKU's journal `key`. Call it only with a
-- journal key, so that a call with the journal off builds none of its
-- arguments.
local function journal(key, ev, id, ds, dh, st, hd, ono)
  redis.call('XADD', key, '*', 'e', journal_entry(ev, id, ds, dh, st, hd, ono))
end

-- How many expired holds one call releases at most: a SKU with a backlog
-- is cleaned over several calls, and no call blocks Redis for long.
local RELEASE_BOUND = 32

-- The units on hold go down by qty; the counter goes when it reaches 0.
-- Returns the units held after it.
local function unhold(held_key, qty)
  local left = redis.call('DECRBY', held_key, qty)
  if left <= 0 then
    redis.call('DEL', held_key)
    return 0
  end
  return left
end

-- A record's TTL when its state changes: never shorter than it was, and
-- at least a retry window from now. A HELD record has none (hold.lua), so
-- the record that ends a hold gets exactly the window.
local function set_lasting(record_key, text, window)
  if redis.call('PTTL', record_key) > window then
    redis.call('SET', record_key, text, 'KEEPTTL')
  else
    redis.call('SET', record_key, text, 'PX', window)
  end
end

-- Gives one expired hold's units back: the record becomes EXPIRED, lasting
-- a retry window from now (set_lasting), and leaves the holds set.
-- `record` is the parsed record of `record_key`, in state H.
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

-- Releases the SKU's holds that expired by `now`, at most RELEASE_BOUND of
-- them. Returns how many it released and their units. Call it only once
-- the stock was read as an integer (a release adds to it). `window` is the
-- retry window in ms, the released record's TTL.
--
-- A hold's units are in its record alone, so a HELD record has no TTL
-- (hold.lua): it lasts until the hold ends, however long nothing touches
-- the SKU, and every entry here finds its units. An entry whose record is
-- a hold no more (confirmed, given back) just leaves the set, as does one
-- with no record at all, which only a hold placed by a version before 4.1
-- can leave (its record had a TTL, and nothing released it in time: its
-- units are not known any more; README "Upgrading"); one whose record
-- this version can't read stays, for the newer script that wrote it.
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
      -- Not due after all: back at its own expiry.
      redis.call('ZADD', holds_key, record.expires, id)
    elseif not raw or record then
      redis.call('ZREM', holds_key, id)
    end
  end
  return released, units
end

-- What every call on a SKU does before it decides anything: the SKU's
-- expired holds go back to stock (at most RELEASE_BOUND of them). `stock`
-- is the stock as read: nothing is released when the key is missing.
-- Returns the stock after it, how many holds were released, and now (0
-- when the SKU has no holds, so Redis time was not needed). A SKU with no
-- holds pays one EXISTS. `window`: as for release_expired.
local function release_due(stock_key, holds_key, held_key, stock, held, window, journal_key)
  -- held (from read_request) is above 0 exactly while the SKU has holds;
  -- a caller that did not read it asks the holds key instead.
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
  return stock + units, released, now, units
end

-- What every call on one request (DEDUCT, HOLD, CONFIRM, REVERT) does
-- first: one read of the stock, the record and the units held
-- (read_request), a stock value or a record this version can't read
-- refused (an error; nothing was changed), then the SKU's expired holds
-- given back (release_due, which gives nothing back where the stock key is
-- missing: a script's UNKNOWNSKU may come after it). Returns the error
-- reply; or nil, then the stock after the release, the record's raw text
-- and the record (nil when none), the units still held, the holds
-- released and now (0 when Redis time was not needed).
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
  local released, now, units
  stock, released, now, units = release_due(stock_key, holds_key, held_key, stock, held, window,
    journal_key)
  if released > 0 then
    -- What went back to stock is no longer held: the units the release
    -- counted, not the stock's difference, which a double rounds past 2^53.
    held = held - units
  end
  return nil, stock, raw, record, held, released, now
end

-- The request's own hold, when it ran out by `now` but the bounded release
-- above did not reach it: released here, so the call answers by the hold's
-- expiry, not by whether anything released it yet. Returns the record as
-- it is now, and 1 when it was released here (0 otherwise). A missing
-- stock key is created by the release (the caller has refused the call
-- already unless --missing-stock is "zero").
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

-- The earliest expiry among the SKU's holds, or 0 when it has none.
local function earliest_hold(holds_key)
  local first = redis.call('ZRANGE', holds_key, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2])
  end
  return 0
end

-- The reply of every call on one request (DEDUCT, REVERT, HOLD, CONFIRM):
-- {code, stock, order_no, VERSION, reason, expires_at, released, held_ms,
-- event, held}. stockgate shows the caller the first four (and the reason
-- for code 3; expires_at for HOLD and CONFIRM); the rest feeds its metrics
-- and memory: released counts the SKU's expired holds this call gave back,
-- held_ms is how long a hold was held before its CONFIRM, event what this
-- call did to the request's own hold ("placed", "confirmed", "cancelled",
-- or ""), and held (DEDUCT's 2 only) the SKU's units on hold then, which
-- tells stockgate's sold-out path that a read could not answer the SKU
-- (src/stock/sold_out.rs). Elements after the fourth that hold their
-- default (0 or "") are left off from the end, so a reader takes a missing
-- one as its default.
local function answer(code, stock, order_no, reason, expires_at, released, held_ms, event, held)
  if (reason or '') == '' and (expires_at or 0) == 0 and (released or 0) == 0
    and (held_ms or 0) == 0 and (event or '') == '' and (held or 0) == 0 then
    -- Most replies: the four elements there were before holds, built
    -- without the trimming below (4k instructions less per call).
    return {code, stock or -1, order_no or '', VERSION}
  end
  local reply = {code, stock or -1, order_no or '', VERSION, reason or '', expires_at or 0,
                 released or 0, held_ms or 0, event or '', held or 0}
  -- Trailing defaults are left off (a missing element reads as its
  -- default): Redis encodes no more than it must.
  local n = #reply
  while n > 4 and (reply[n] == 0 or reply[n] == '') do
    reply[n] = nil
    n = n - 1
  end
  return reply
end

-- An operator's change, recorded under its op_id (STOCK.SET, STOCK.ADD):
-- "3:<kind>:<amount>:<nonce>:<after>:", kind A (added amount) or S (set to
-- amount), after the stock it left. Returns {kind, amount, nonce, after}.
local function parse_op(raw)
  local kind, amount, nonce, after = string.match(raw, '^3:([AS]):(%-?%d+):(%x*):(%-?%d*):$')
  if not kind then
    return nil
  end
  return {kind = kind, amount = amount, nonce = nonce, after = after}
end

local function op_text(kind, amount, nonce, after)
  -- %d, not tostring: Lua 5.1 spells integers past 10^14 as 1e+14.
  if type(after) == 'number' then
    after = string.format('%d', after)
  end
  return '3:' .. kind .. ':' .. amount .. ':' .. nonce .. ':' .. after .. ':'
end
