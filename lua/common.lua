-- stockgate's shared script helpers. Each script is a function of (KEYS,
-- ARGV) with its own file; this file holds what they share, so every
-- script applies the same rules.
--
-- Loaded as a function library (FUNCTION LOAD, called by FCALL), this file
-- is the library's top level, run once at load: its helpers, constants and
-- reply tables exist once, and each script's own top level (its private
-- helpers, its function) once too (src/script.rs, Library). Called by
-- EVALSHA, stockgate inserts the helpers a script names where it says
-- --@common, and the whole chunk runs on every call; the text Redis runs
-- (and its SHA) includes them. Written for the first: a call creates no
-- closure, reaches no global, and builds no table it can reuse.

-- The version of the script set: the fourth element of every reply.
-- 3: records carry the call's nonce; stockgate's own arguments, when
-- wrong, are a BADCALL error, never code 3.
-- 4: holds (HOLD, CONFIRM, code 5), released by Redis time.
local VERSION = 4
-- Lua numbers are doubles: integers beyond 2^53 - 1 lose precision.
local EXACT = 9007199254740991

-- Redis's API and the library functions the scripts use, as upvalues. A
-- function of a library reaches a global through its sandbox's lookup
-- (about 0.5k instructions in Redis each time), and the library's top
-- level runs at FUNCTION LOAD, where neither `redis.call` nor `string`
-- exists yet: so each script's function binds them at its first call
-- (`if not call then bind() end`, its first line), and the library keeps
-- them. An EVALSHA binds them on every call, as it looked them up before.
local call, rpcall, error_reply, find, match, sub, format, to_number, unpack_all, type_of

local function bind()
  call, rpcall, error_reply = redis.call, redis.pcall, redis.error_reply
  find, match, sub, format = string.find, string.match, string.sub, string.format
  to_number, unpack_all, type_of = tonumber, unpack, type
end

-- A canonical positive decimal integer ("1", never "01" or "+1"), or nil.
local function positive_int(s)
  if not s or #s > 16 or not find(s, '^[1-9]%d*$') then
    return nil
  end
  return to_number(s)
end

-- The last qty a call gave, and its number: most calls of a shop, and all
-- of a flash sale, take 1, which is then checked and parsed once.
local known_qty, known_qty_n = false, nil

-- positive_int, remembered (known_qty). Hot callers compare with known_qty
-- first.
local function qty_of(s)
  local qty = positive_int(s)
  if qty then
    known_qty, known_qty_n = s, qty
  end
  return qty
end

-- stockgate's settings as the last call that passed them gave them: the
-- same text (every call of one stockgate) is the same interned string, so
-- a library checks each setting with one comparison, and parses it once.
local known_window, known_window_ms, known_max, known_max_qty = false, nil, false, nil

-- The retry window in milliseconds, or nil when under a minute.
local function window_ms(s)
  if s == known_window then
    return known_window_ms
  end
  local window = positive_int(s)
  if not window or window < 60000 then
    return nil
  end
  known_window, known_window_ms = s, window
  return window
end

-- The retry window `ms` as text, for a write's PX: as stockgate sent it
-- (window_ms kept it), so that Redis reads it without Lua formatting a
-- number (about 2k instructions a number, whatever redis.call is given).
local function window_text(ms)
  if ms == known_window_ms then
    return known_window
  end
  return format('%d', ms)
end

-- The max qty setting as a number, or nil when it is not a positive
-- integer. Hot callers compare with known_max first.
local function max_qty_of(s)
  if s == known_max then
    return known_max_qty
  end
  local max = positive_int(s)
  if max then
    known_max, known_max_qty = s, max
  end
  return max
end

-- The keys of the SKU whose stock key the last call named (one hash tag,
-- one slot): what a record key must start with, the holds set, the units
-- held, the journal and its marker (journal_of). Made once per SKU in a
-- row, which a hot SKU's calls are.
local known_stock, req_prefix, holds_name, held_name = false, nil, nil, nil
local journal_name, marker_name = nil, nil

local function sku_keys(stock_key)
  if stock_key ~= known_stock then
    known_stock = stock_key
    req_prefix = stock_key .. ':req:'
    holds_name, held_name = stock_key .. ':holds', stock_key .. ':held'
    journal_name = stock_key .. ':journal'
    marker_name = stock_key .. ':journal:on'
  end
end

-- The locations hash of the SKU sku_keys was last called with: made (by
-- enter) only for the calls that may meet a SKU kept by location, so a
-- DEDUCT on a new SKU builds no name it does not use.
local loc_stock, loc_name = false, nil

-- The record key must be the stock key plus ":req:<request_id>", so the
-- record belongs to the SKU whose stock the call changes (and, in a
-- cluster, shares its slot: the stock key's hash tag is the record key's).
-- That is all a script checks of it: the request_id's own rules (length,
-- printable, no braces) protect no stored data, since the key is the
-- caller's to name and the record under it reads the same whatever the
-- id, and stockgate has checked them before it built the key.
-- `prefix` is req_prefix (sku_keys) or another stock key's.
local function record_key_under(prefix, record_key)
  return #record_key > #prefix and find(record_key, prefix, 1, true) == 1
end

-- Returns true when the record key follows the layout (above). Call
-- sku_keys(stock_key) first.
local function keys_follow_layout(record_key)
  return record_key_under(req_prefix, record_key)
end

-- A SKU's keys beside its stock key: its holds (a sorted set of the
-- request_ids holding units, by expiry in milliseconds of Redis time), the
-- units held now, its journal's marker and its journal; then `last`, when
-- given (the locations hash, for a call that may meet a SKU kept by
-- location). A call declares them all, for request_fault's reason, from
-- `keys[first]` on, and nothing after. Returns true when they are those of
-- the stock key sku_keys was called with.
local function side_keys_follow(keys, first, last)
  return keys[first] == holds_name and keys[first + 1] == held_name
    and keys[first + 2] == marker_name and keys[first + 3] == journal_name
    and keys[first + 4] == last and not keys[first + (last and 5 or 4)]
end

-- An operator's op record key must be the stock key plus ":op:<op_id>".
local function op_key_follows_layout(stock_key, op_key)
  local prefix = stock_key .. ':op:'
  local op_id = sub(op_key, #prefix + 1)
  return find(stock_key, '{', 1, true) ~= nil
    and sub(op_key, 1, #prefix) == prefix
    and #op_id >= 1 and #op_id <= 128
    and not find(op_id, '[^!-~]')
    and not find(op_id, '[{}]')
end

-- An error for an argument stockgate itself supplies (not the caller): a
-- version mismatch between stockgate and its scripts, or a bug. Never a
-- business code: the caller must not take it for "invalid parameters".
local function badcall(what)
  return error_reply('BADCALL ' .. what .. ' (stockgate supplies it: a version mismatch or a bug); nothing was changed')
end

-- ARGV "replicate": "1" with --wait-replicas, else "0" (absent reads as
-- "0"). Returns the BADCALL error to return for any other value, or nil.
local function bad_replicate(flag)
  if flag == nil or flag == '0' or flag == '1' then
    return nil
  end
  return badcall('the replicate flag must be "0" or "1"')
end

-- A call nonce: 1 to 32 hex digits.
local function nonce_ok(nonce)
  return nonce and #nonce <= 32 and find(nonce, '^%x+$')
end

-- What stockgate supplies alike for every call on one request (DEDUCT,
-- REVERT, HOLD, CONFIRM) is one argument, the call's settings: its
-- settings' values, in the order the script's file lists them, then the
-- call's flags "<replicate><journal>", separated by single spaces, e.g.
-- "86400000 1000000 error 00" (DEDUCT: window, max qty, missing-stock mode,
-- flags). Each flag is "1" (on) or "0": replicate with --wait-replicas
-- (replicate_again), journal with --journal (journal_of). One argument,
-- not five: every argument of a call costs Redis about 0.7k instructions,
-- and a library checks and parses a settings text once (SETTLED), where
-- every call of one stockgate sends the same.

-- Settings texts already checked, and what they say: {window (ms),
-- window_arg (its text), max_qty, max_arg, max_hold, max_hold_arg,
-- missing_zero, replicate, journal}. Kept to a handful: a stockgate sends
-- two or three texts (an order's lines take missing stock as zero), and a
-- text nobody sends again must not grow Redis's memory.
local SETTLED, settled_count = {}, 0

-- Checks `text`, the settings of a script whose words are `names` (each
-- "window", "max_qty", "max_hold" or "missing"; the flags come last) and
-- match `shape` (one capture per word). Returns what it says (SETTLED's
-- shape), or nil and the BADCALL error to return, for the first word in
-- order that is wrong.
local function settle(text, names, shape)
  local words = {match(text or '', shape)}
  if not words[1] then
    return nil, badcall('the call\'s settings must be ' .. #names + 1 .. ' words')
  end
  local settled = {}
  for i = 1, #names do
    local name, word = names[i], words[i]
    if name == 'window' then
      settled.window = window_ms(word)
      settled.window_arg = word
      if not settled.window then
        return nil, badcall('retry window must be at least 60000 ms')
      end
    elseif name == 'max_qty' then
      settled.max_qty = positive_int(word)
      settled.max_arg = word
      if not settled.max_qty then
        return nil, badcall('max qty must be a positive integer')
      end
    elseif name == 'max_hold' then
      settled.max_hold = positive_int(word)
      settled.max_hold_arg = word
      if not settled.max_hold or settled.max_hold < 1000 then
        return nil, badcall('max hold must be a positive integer, at least 1000')
      end
    elseif word == 'error' or word == 'zero' then
      settled.missing_zero = word == 'zero'
    else
      return nil, badcall('missing-stock mode must be "error" or "zero"')
    end
  end
  local flags = words[#names + 1]
  if flags ~= '00' and flags ~= '01' and flags ~= '10' and flags ~= '11' then
    return nil, badcall('the call flags must be "00", "01", "10" or "11" (replicate, journal)')
  end
  settled.replicate, settled.journal = sub(flags, 1, 1) == '1', sub(flags, 2, 2) == '1'
  if settled_count >= 8 then
    SETTLED, settled_count = {}, 0
  end
  SETTLED[text], settled_count = settled, settled_count + 1
  return settled
end

-- The checks every call on one request makes of its keys and of its
-- nonce, once its settings passed. KEYS: the stock key, the record key
-- (which must lie under it), then the SKU's holds, held units, journal
-- marker and journal, and `last` after them when given (the locations
-- hash), which must be the names sku_keys makes. The scripts
-- use the names sku_keys makes; the keys are declared all the same because
-- in a cluster only a declared key is checked before the call runs: while
-- its slot migrates, a key the script touched undeclared, absent from this
-- node, fails the command that touches it, maybe after a write (a release
-- whose units went back before its journal entry was refused would give
-- them back again), or, on the node the slot moves to, reads as missing;
-- a declared one makes Redis answer TRYAGAIN or ASK before anything ran.
-- The marker says whether the journal exists; it does not say the journal
-- is on this node, so the journal is declared too. Returns the BADCALL
-- error to return, or nil. Leaves
-- sku_keys set for KEYS[1]. Its helpers are written out, as every such
-- call makes it.
local function request_fault(keys, nonce, last)
  local stock_key, record_key = keys[1], keys[2]
  if stock_key ~= known_stock then
    sku_keys(stock_key)
  end
  if #record_key <= #req_prefix or find(record_key, req_prefix, 1, true) ~= 1
      or not side_keys_follow(keys, 3, last) then
    return badcall('keys do not follow the stockgate key layout')
  end
  if not nonce or #nonce > 32 or not find(nonce, '^%x+$') then
    return badcall('the call nonce must be 1 to 32 hex digits')
  end
  return nil
end

-- What every call on one request (REVERT, HOLD, CONFIRM, HOLD.EXTEND,
-- HOLD.SHRINK; DEDUCT writes it out) checks first, before it reads
-- anything: its settings, the text `text` of words `names` in `shape`
-- (settle: a library checks a settings text once), then its keys and
-- nonce (request_fault; with `located`, the SKU's locations hash after
-- its other keys). Returns the settings; or nil and the error to return.
local function enter(keys, text, names, shape, nonce, located)
  local settings = SETTLED[text]
  if not settings then
    local bad
    settings, bad = settle(text, names, shape)
    if bad then
      return nil, bad
    end
  end
  local last
  if located then
    local stock_key = keys[1]
    if loc_stock ~= stock_key then
      loc_stock, loc_name = stock_key, stock_key .. ':loc'
    end
    last = loc_name
  end
  local bad = request_fault(keys, nonce, last)
  if bad then
    return nil, bad
  end
  return settings
end

-- The checks STOCK.SET and STOCK.ADD make of what stockgate supplies.
-- KEYS: the stock key, the op record, then the SKU's side keys. Leaves
-- sku_keys set for the stock key.
local function own_op_args(keys, window_arg, nonce)
  local stock_key, op_key = keys[1], keys[2]
  local window = window_ms(window_arg)
  if not window then
    return nil, badcall('retry window must be at least 60000 ms')
  end
  sku_keys(stock_key)
  if not op_key_follows_layout(stock_key, op_key) or not side_keys_follow(keys, 3) then
    return nil, badcall('keys do not follow the stockgate key layout')
  end
  if not nonce_ok(nonce) then
    return nil, badcall('the call nonce must be 1 to 32 hex digits')
  end
  return window
end

-- `replicate`: true with --wait-replicas. Then stockgate sends WAIT after
-- the script on the same
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
local function replicate_again(replicate, key)
  if not replicate then
    return
  end
  local raw = call('GET', key)
  if not raw then
    return
  end
  local at = call('PEXPIRETIME', key)
  if at > 0 then
    call('SET', key, raw, 'PXAT', at)
  else
    call('SET', key, raw, 'KEEPTTL')
  end
end

-- A stock value as read: nil when the key is missing, false when it is not
-- an exact integer, otherwise the number.
local function parse_stock(raw)
  if not raw then
    return nil
  end
  local n = nil
  if #raw <= 17 and find(raw, '^%-?%d+$') then
    n = to_number(raw)
  end
  if not n or n > EXACT or n < -EXACT then
    return false
  end
  return n
end


-- What a call on one request reads first, in one MGET (the keys share a
-- slot): the stock (as parse_stock gives it), the record's raw text (false
-- when none), the SKU's units on hold (0 when none) and the stock value as
-- stored. One call instead of three is what keeps a DEDUCT on a SKU
-- without holds as cheap for Redis as it was before holds existed.
local function read_request(stock_key, record_key, held_key)
  local got = call('MGET', stock_key, record_key, held_key)
  local held = got[3]
  return parse_stock(got[1]), got[2], held and to_number(held) or 0, got[1]
end

local BADSTOCK = 'BADSTOCK stock value is not an integer; nothing was changed'

-- A SKU kept by location (docs/locations.md) has this text as its stock
-- value, never an integer: the scripts of a SKU that keeps one number meet
-- it only where they would refuse a stock value (BADSTOCK), and answer
-- LOCATED there instead (`error_reply(raw == LOCATED and LOCATEDSKU or
-- BADSTOCK)`, `raw` the value read), having changed nothing; stockgate then
-- sends the call on to lua/allocate.lua. A SKU that keeps one number pays
-- nothing for it, and an older stockgate's scripts refuse it with
-- BADSTOCK. Written out where it is used, not a helper: a script called by
-- EVALSHA makes each helper it names anew on every call (as a helper, it
-- cost an EVALSHA DEDUCT about 1.6k instructions more, by script-cost).
local LOCATED = 'loc'
local LOCATEDSKU = 'LOCATED the sku keeps its stock by location; nothing was changed'
-- The reason of code 3 for a change of a SKU kept by location that names
-- no location: STOCK.SET or STOCK.ADD without AT, an import's row without
-- its location (src/bulk.rs reports it).
local NAME_LOCATION = 'the sku keeps its stock by location: name the location'
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
-- H, C and X, which keep it. A hold that gave some units back
-- (HOLD.SHRINK) holds qty units now and keeps the qty its HOLD asked for as
-- a third part, "<expires_at>.<held_at>.<asked>", so a HOLD sent again
-- still matches. The nonce names the call that wrote it: a call sent again
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
--
-- A record made by allocation (parse_located) is another shape here: its
-- units came from locations, and a script of a SKU that keeps one number
-- must never give them to, or take them from, that number. It meets one
-- only where the SKU's stock key was overwritten with a number behind
-- stockgate's back, and answers BADRECORD there, having changed nothing;
-- a hold's such record stays in the holds set (release_expired). Refused
-- for nothing: its first byte, `@`, matches none of the patterns below.
local function parse_record(raw)
  local state, qty, nonce, aux, order_no =
    match(raw, '^3:([DRVHCX]):(%d+):(%x*):([%d.]*):(.*)$')
  if state then
    local expires, held_at = 0, 0
    local asked
    if state == 'H' or state == 'C' or state == 'X' then
      local e, h = match(aux, '^(%d+)%.(%d+)$')
      if not e then
        -- A hold that gave some of its units back (lua/change_hold.lua)
        -- keeps the qty its HOLD asked for third.
        e, h, asked = match(aux, '^(%d+)%.(%d+)%.(%d+)$')
        if not e then
          return nil
        end
      end
      expires, held_at = to_number(e), to_number(h)
    elseif aux ~= '' and not find(aux, '^%d*$') then
      -- Version 3 read (and ignored) digits here; so does this one.
      return nil
    end
    return {state = state, qty = qty, nonce = nonce, aux = aux, order_no = order_no,
            expires = expires, held_at = held_at, asked = asked}
  end
  state, qty, order_no = match(raw, '^([DRV]):(%d+):(.*)$')
  if state then
    return {state = state, qty = qty, nonce = '', aux = '', order_no = order_no,
            expires = 0, held_at = 0}
  end
  return nil
end

-- A record as a SKU kept by location reads it (lua/allocate.lua): one
-- made by allocation has where its units came from first,
-- "@<location>=<units>,...;" and then the usual record, and reads as
-- parse_record's with `alloc`, that text; any other reads as parse_record
-- reads it (a REVOKED record, which took nothing, names no location).
local function parse_located(raw)
  local alloc, rest = match(raw, '^@([^;]*);(3:.*)$')
  if not alloc then
    return parse_record(raw)
  end
  local record = parse_record(rest)
  if record then
    record.alloc = alloc
  end
  return record
end

-- A record's state as STOCK.STATUS names it.
local STATE_NAMES = {D = 'DEDUCTED', R = 'REVERTED', V = 'REVOKED', H = 'HELD',
                     C = 'CONFIRMED', X = 'EXPIRED'}

local function record_text(state, qty, nonce, aux, order_no)
  return '3:' .. state .. ':' .. qty .. ':' .. nonce .. ':' .. aux .. ':' .. order_no
end

-- Now, in milliseconds of Redis time: what decides every expiry. Sidecars on
-- many hosts may disagree about the time; Redis does not. Asked only where
-- an expiry is decided or compared.
local function now_ms()
  local t = call('TIME')
  local us = to_number(t[2])
  return to_number(t[1]) * 1000 + (us - us % 1000) / 1000
end

-- Lua 5.1 spells integers past 10^14 as 1e+14: every integer put in a key
-- or a record goes through this.
local function int_text(n)
  return format('%d', n)
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

-- Whether a SKU has a journal: its stream, and beside it a marker,
-- <stock key>:journal:on ("1"), which lua/journal_open.lua makes in the
-- same call as the stream and `stockgate journal retire` deletes with it.
-- The calls on one request (DEDUCT, HOLD, CONFIRM, REVERT, and coalesced
-- DEDUCTs) read the marker in the MGET they make anyway, where an EXISTS
-- of the stream would cost each one more call (about 2.6k instructions).
-- A journal opened by a release before the marker has none until a call
-- with the journal on, refused with NOJOURNAL, opens it again, or the
-- sink marks it (docs/books.md); a journal entry is appended with
-- NOMKSTREAM, so a stale marker never makes a stream nobody listed.
--
-- The key this call journals to: the SKU's journal when it has one, false
-- when it has none and `journal_on` (--journal) is not true; nil and the
-- NOJOURNAL error to return when it has none and `journal_on` is. Asked
-- before the call's first write, by the scripts that do not read the
-- marker anyway, of the stream itself. Call sku_keys(stock_key) first.
local function journal_of(journal_on)
  if call('EXISTS', journal_name) == 1 then
    return journal_name
  end
  if journal_on then
    return nil, error_reply(NOJOURNAL)
  end
  return false
end

-- One entry, as one field `e`: "1 <event> <id> <stock change> <held
-- change> <stock after> <held after> <order_no>" (the format version
-- first; the order_no last, as it may hold spaces; the entry's id,
-- <ms>-<seq>, carries Redis time). One field, not nine: an XADD's cost
-- grows with its arguments, and this is on every change. The changes come
-- as strings, the stock and held units after it as numbers; "held after"
-- is most often 0, which needs no formatting.
local function journal_entry(ev, id, ds, dh, st, hd, ono)
  local after
  if hd == 0 then
    after = format('%d 0 ', st)
  else
    after = format('%d %d ', st, hd)
  end
  return '1 ' .. ev .. ' ' .. id .. ' ' .. ds .. ' ' .. dh .. ' ' .. after .. (ono or '')
end

-- Appends the entry to the SKU's journal `key`. Call it only with a
-- journal key, so that a call with the journal off builds none of its
-- arguments.
local function journal(key, ev, id, ds, dh, st, hd, ono)
  call('XADD', key, 'NOMKSTREAM', '*', 'e', journal_entry(ev, id, ds, dh, st, hd, ono))
end

-- How many expired holds one call releases at most: a SKU with a backlog
-- is cleaned over several calls, and no call blocks Redis for long. As
-- text, as redis.call takes it best.
local RELEASE_BOUND = '32'

-- The units on hold go down by qty; the counter goes when it reaches 0.
-- Returns the units held after it.
local function unhold(held_key, qty)
  local left = call('DECRBY', held_key, qty)
  if left <= 0 then
    call('DEL', held_key)
    return 0
  end
  return left
end

-- A record's TTL when its state changes: never shorter than it was, and
-- at least a retry window from now. A HELD record has none (hold.lua), so
-- the record that ends a hold (`held`: the record was HELD) gets exactly
-- the window, with no need to ask.
local function set_lasting(record_key, text, window, held)
  if not held and call('PTTL', record_key) > window then
    call('SET', record_key, text, 'KEEPTTL')
  else
    call('SET', record_key, text, 'PX', window_text(window))
  end
end

-- Gives one expired hold's units back: the record becomes EXPIRED, lasting
-- a retry window from now (set_lasting), and leaves the holds set.
-- `record` is the parsed record of `record_key`, in state H.
local function release_one(stock_key, holds_key, held_key, record_key, record, window, journal_key)
  local stock = call('INCRBY', stock_key, record.qty)
  local held = unhold(held_key, record.qty)
  local id = sub(record_key, #stock_key + 6)
  if journal_key then
    journal(journal_key, 'expire', id, record.qty, '-' .. record.qty, stock, held,
      record.order_no)
  end
  call('ZREM', holds_key, id)
  set_lasting(record_key,
    record_text('X', record.qty, record.nonce, record.aux, record.order_no), window, true)
end

-- Releases the SKU's holds that expired by `now`, at most RELEASE_BOUND of
-- them. Returns how many it released and their units. Call it only once
-- the stock was read as an integer (a release adds to it). `window` is the
-- retry window in ms, the released record's TTL.
--
-- A hold's units are in its record alone, so a HELD record has no TTL
-- (hold.lua): it lasts until the hold ends, however long nothing touches
-- the SKU, and every entry here finds its units. An entry whose record is
-- a hold no more (confirmed, given back) just leaves the set. One whose
-- record this version can't read stays, for the newer script that wrote
-- it. One with no record at all stays too while it expired less than a
-- retry window ago: its record may not be on this node yet (its slot is
-- moving here, and a record of another request is a key no call
-- declares, which reads as missing on the node the slot moves to), and a
-- later call finds it there. Past that it leaves: only a hold placed by a
-- version before 4.1 leaves an entry without a record (its record had a
-- TTL, and nothing released it in time: its units are not known any
-- more; docs/operations.md, "Upgrading").
local function release_expired(stock_key, holds_key, held_key, now, window, journal_key)
  local due = call('ZRANGEBYSCORE', holds_key, '-inf', now, 'WITHSCORES', 'LIMIT', '0',
    RELEASE_BOUND)
  local released, units = 0, 0
  for i = 1, #due, 2 do
    local id = due[i]
    local record_key = stock_key .. ':req:' .. id
    local raw = call('GET', record_key)
    local record = raw and parse_record(raw)
    if record and record.state == 'H' and record.expires <= now then
      release_one(stock_key, holds_key, held_key, record_key, record, window, journal_key)
      released = released + 1
      units = units + to_number(record.qty)
    elseif record and record.state == 'H' then
      -- Not due after all: back at its own expiry.
      call('ZADD', holds_key, record.expires, id)
    elseif record or (not raw and to_number(due[i + 1]) + window < now) then
      call('ZREM', holds_key, id)
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
    held = call('EXISTS', holds_key)
  end
  if held <= 0 then
    return stock, 0, 0
  end
  local now = now_ms()
  local released, units = release_expired(stock_key, holds_key, held_key, now, window, journal_key)
  return stock + units, released, now, units
end

-- A SKU kept by location (docs/locations.md) has LOCATED as its stock
-- key's value and its units in one hash, <stock key>:loc, three fields a
-- location: "<location>" its available units, "<location>:held" its
-- units on hold (absent: 0), "<location>:floor" what an allocation leaves
-- there (absent: 0). Its holds set and its units held (all locations) are
-- any SKU's. A record made by allocation (lua/allocate.lua) carries where
-- its units came from before the usual record (parse_located). What
-- follows is how its units move; the calls that may meet such a SKU
-- (REVERT, CONFIRM, HOLD.EXTEND, HOLD.SHRINK, the allocations and the
-- reads of lua/allocate.lua) declare the hash as a key of their own.

local LOCGONE = 'LOCGONE a location of this sku is missing from its hash; nothing was changed'

-- What only the calls on a SKU kept by location use, made by
-- bind_located the first time such a call needs them: a function library
-- keeps them, and a call by EVALSHA, whose whole chunk runs on every call
-- (each function it defines a closure made again: src/script.rs,
-- helpers_for), makes them only when it meets such a SKU, so a REVERT of
-- a SKU that keeps one number pays for none of them.
local gmatch, sort, concat
local read_locations, total_of, location_ok, allocation_of, allocation_text, allocation_flat
local all_present, move, located_text, release_located, release_due_located

local function bind_located()
  if move then
    return
  end
  gmatch, sort, concat = string.gmatch, table.sort, table.concat

  -- The locations hash as tables: units, held, floor by name, and the names
  -- in the hash's order. Read whole: a SKU has at most SKU_LOCATIONS.
  read_locations = function(loc_key)
    local flat = call('HGETALL', loc_key)
    local units, held, floor, names = {}, {}, {}, {}
    for i = 1, #flat, 2 do
      local field, value = flat[i], to_number(flat[i + 1]) or 0
      local name, part = match(field, '^([^:]+):(%a+)$')
      if name == nil then
        units[field] = value
        names[#names + 1] = field
      elseif part == 'held' then
        held[name] = value
      elseif part == 'floor' then
        floor[name] = value
      end
    end
    return {units = units, held = held, floor = floor, names = names}
  end

  total_of = function(locs)
    local total = 0
    for i = 1, #locs.names do
      total = total + locs.units[locs.names[i]]
    end
    return total
  end

  -- A location name: 1 to 64 of A-Z a-z 0-9 _ . - (so that its fields
  -- ":held" and ":floor" can't be another location's).
  location_ok = function(name)
    return name and #name >= 1 and #name <= 64 and not find(name, '[^%w_%.%-]')
  end

  -- A record's allocation, "w1=2,w2=1", as a list of {name, units}.
  allocation_of = function(text)
    local list = {}
    for name, units in gmatch(text or '', '([^,=]+)=(%d+)') do
      list[#list + 1] = {name, to_number(units)}
    end
    return list
  end

  allocation_text = function(list)
    local parts = {}
    for i = 1, #list do
      parts[i] = list[i][1] .. '=' .. int_text(list[i][2])
    end
    return concat(parts, ',')
  end

  allocation_flat = function(list)
    local flat = {}
    for i = 1, #list do
      flat[#flat + 1] = list[i][1]
      flat[#flat + 1] = list[i][2]
    end
    return flat
  end

  -- Whether every location of `list` is in the hash (LOCGONE otherwise).
  all_present = function(locs, list)
    for i = 1, #list do
      if locs.units[list[i][1]] == nil then
        return false
      end
    end
    return true
  end

  -- Moves `units` at location `name`: `ds` to its available units, `dh` to
  -- those held there, both signed numbers, keeping `locs` as the hash is
  -- now, with its journal entry (format 2: the location's own numbers).
  move = function(loc_key, locs, name, ds, dh, journal_key, ev, id, order_no)
    if ds ~= 0 then
      locs.units[name] = call('HINCRBY', loc_key, name, int_text(ds))
    end
    if dh ~= 0 then
      locs.held[name] = call('HINCRBY', loc_key, name .. ':held', int_text(dh))
    end
    if journal_key then
      call('XADD', journal_key, 'NOMKSTREAM', '*', 'e', '2 ' .. ev .. ' ' .. id .. ' '
        .. int_text(ds) .. ' ' .. int_text(dh) .. ' ' .. int_text(locs.units[name]) .. ' '
        .. int_text(locs.held[name] or 0) .. ' ' .. name .. ' ' .. (order_no or ''))
    end
  end

  -- A located record: the record's text with its allocation before it.
  located_text = function(list, state, qty, nonce, aux, order_no)
    return '@' .. allocation_text(list) .. ';' .. record_text(state, qty, nonce, aux, order_no)
  end

  -- Gives an expired hold's units back to their locations: its record
  -- becomes EXPIRED, lasting a retry window, and leaves the holds set.
  release_located = function(stock_key, loc_key, locs, record_key, record, list, window,
      journal_key)
    local id = sub(record_key, #stock_key + 6)
    for i = 1, #list do
      move(loc_key, locs, list[i][1], list[i][2], -list[i][2], journal_key, 'expire', id,
        record.order_no)
    end
    unhold(held_name, record.qty)
    call('ZREM', holds_name, id)
    set_lasting(record_key, located_text(list, 'X', record.qty, record.nonce, record.aux,
      record.order_no), window, true)
  end

  -- The SKU's holds that ran out by `now`, given back (at most
  -- RELEASE_BOUND). Every location they name is checked before the first
  -- write: LOCGONE (returned second) changes nothing. Returns how many.
  release_due_located = function(stock_key, loc_key, locs, now, window, journal_key)
    local due = call('ZRANGEBYSCORE', holds_name, '-inf', now, 'WITHSCORES', 'LIMIT', '0',
      RELEASE_BOUND)
    local todo = {}
    for i = 1, #due, 2 do
      local id = due[i]
      local record_key = stock_key .. ':req:' .. id
      local raw = call('GET', record_key)
      local record = raw and parse_located(raw)
      if record and record.state == 'H' and record.expires <= now then
        local list = allocation_of(record.alloc)
        if not all_present(locs, list) then
          return 0, error_reply(LOCGONE)
        end
        todo[#todo + 1] = {record_key, record, list}
      elseif record and record.state == 'H' then
        todo[#todo + 1] = {false, id, record.expires}
      elseif record or (not raw and to_number(due[i + 1]) + window < now) then
        todo[#todo + 1] = {false, id, false}
      end
    end
    local released = 0
    for i = 1, #todo do
      local t = todo[i]
      if t[1] then
        release_located(stock_key, loc_key, locs, t[1], t[2], t[3], window, journal_key)
        released = released + 1
      elseif t[3] then
        call('ZADD', holds_name, t[3], t[2])
      else
        call('ZREM', holds_name, t[2])
      end
    end
    return released
  end
end

-- open_request's work for a SKU kept by location: the journal decided,
-- the record read as such a SKU's (parse_located: one that is not a
-- revocation names where its units are, else BADRECORD), the locations
-- read (LOCGONE when the hash is gone: such a SKU has one from its first
-- STOCK.SET ... AT), and the SKU's expired holds given back to their
-- locations. Returns what open_request does, the stock its total over
-- the locations, and the locations last.
local function open_located(stock_key, raw, marker, held, window, journal_on)
  bind_located()
  local journal_key = false
  if marker then
    journal_key = journal_name
  elseif journal_on then
    return error_reply(NOJOURNAL)
  end
  local record = raw and parse_located(raw)
  if raw and (not record or (not record.alloc and record.state ~= 'V')) then
    return error_reply(BADRECORD)
  end
  local locs = read_locations(loc_name)
  if #locs.names == 0 then
    return error_reply(LOCGONE)
  end
  local released, now = 0, 0
  if held and to_number(held) > 0 then
    now = now_ms()
    local gone
    released, gone = release_due_located(stock_key, loc_name, locs, now, window, journal_key)
    if gone then
      return gone
    end
  end
  return nil, total_of(locs), raw, record, 0, released, now, journal_key, locs
end

-- What every call on one request (HOLD, CONFIRM, REVERT, HOLD.EXTEND,
-- HOLD.SHRINK) does first, once request_fault has set sku_keys: one read
-- of the stock, the record, the units held and the journal's marker, a
-- stock value or a record this version can't read refused (an error;
-- nothing was changed), the journal decided (journal_of's rule, by the
-- marker), then the SKU's expired holds given back (release_due, which
-- gives nothing back where the stock key is missing: a script's
-- UNKNOWNSKU may come after it). A SKU kept by location is read so too
-- by the calls that declared its locations hash, which pass open_located
-- as `located` (a script that does not name it is spliced without it:
-- src/script.rs); the others answer LOCATED, having changed nothing. Returns
-- the error reply; or nil, then the stock after the release, the
-- record's raw text and the record (nil when none), the units still held,
-- the holds released, now (0 when Redis time was not needed), the
-- journal key (false when none), and for a SKU kept by location its
-- locations (read_locations).
local function open_request(stock_key, record_key, window, journal_on, located)
  local holds_key, held_key = holds_name, held_name
  local got = call('MGET', stock_key, record_key, held_key, marker_name)
  local stock, raw, held = parse_stock(got[1]), got[2], got[3]
  if stock == false then
    if got[1] ~= LOCATED then
      return error_reply(BADSTOCK)
    end
    if not located then
      return error_reply(LOCATEDSKU)
    end
    return located(stock_key, raw, got[4], held, window, journal_on)
  end
  held = held and to_number(held) or 0
  local record = raw and parse_record(raw)
  if raw and not record then
    return error_reply(BADRECORD)
  end
  local journal_key = false
  if got[4] then
    journal_key = journal_name
  elseif journal_on then
    return error_reply(NOJOURNAL)
  end
  local released, now = 0, 0
  if held > 0 then
    local units
    stock, released, now, units = release_due(stock_key, holds_key, held_key, stock, held, window,
      journal_key)
    if released > 0 then
      -- What went back to stock is no longer held: the units the release
      -- counted, not the stock's difference, which a double rounds past 2^53.
      held = held - units
    end
  end
  return nil, stock, raw, record, held, released, now, journal_key
end

-- The request's own hold, when it ran out by `now` but the bounded release
-- above did not reach it: released here, so the call answers by the hold's
-- expiry, not by whether anything released it yet. Returns the record as
-- it is now, 1 when it was released here (0 otherwise), and the caller's
-- `stock` and `released` (its count of holds released) after it. A
-- missing stock key is created by the release (the caller has refused the
-- call already unless --missing-stock is "zero").
local function release_own(stock_key, holds_key, held_key, record_key, record, now, window,
    journal_key, stock, released)
  if not record or record.state ~= 'H' or record.expires > now then
    return record, 0, stock, released
  end
  local raw = call('GET', record_key)
  local fresh = raw and parse_record(raw)
  if not fresh or fresh.state ~= 'H' then
    return fresh, 0, stock, released
  end
  release_one(stock_key, holds_key, held_key, record_key, fresh, window, journal_key)
  fresh.state = 'X'
  return fresh, 1, (stock or 0) + to_number(fresh.qty), released + 1
end

-- release_own for a SKU kept by location (`locs`): the request's own hold
-- that ran out, given back to the locations it came from. Returns the
-- record as it is now, 1 when it was released here (0 otherwise), the
-- caller's count of holds released after it, and the error to return
-- (LOCGONE: a location it names is gone; nothing was changed).
local function release_own_located(stock_key, record_key, record, now, window, journal_key, locs,
    released)
  if not record or record.state ~= 'H' or record.expires > now then
    return record, 0, released
  end
  local raw = call('GET', record_key)
  local fresh = raw and parse_located(raw)
  if not fresh or fresh.state ~= 'H' or not fresh.alloc then
    return fresh, 0, released
  end
  local list = allocation_of(fresh.alloc)
  if not all_present(locs, list) then
    return nil, 0, released, error_reply(LOCGONE)
  end
  release_located(stock_key, loc_name, locs, record_key, fresh, list, window, journal_key)
  fresh.state = 'X'
  return fresh, 1, released + 1
end

-- A request's state machine: what REVERT, CONFIRM, HOLD.EXTEND and
-- HOLD.SHRINK (`op`: 'revert', 'confirm', 'extend', 'shrink') do to the
-- request whose record is `record` (nil: none), whichever way its SKU
-- keeps its stock (lua/revert.lua has the whole table; lua/deduct.lua and
-- lua/hold.lua the columns of the calls that take or hold). Call it once
-- the request's own hold that ran out was released (`own`: 1 when this
-- call released it). Returns the code, what the call does, and what the
-- reply shows: its order_no, expires_at, reason and event. What it does:
--   CHANGES  give back (REVERT of DEDUCTED, HELD, CONFIRMED), confirm
--            (CONFIRM of HELD) or change (HOLD.EXTEND, HOLD.SHRINK of
--            HELD): the script does it, as its SKU keeps its stock
--   REVOKES  record the id REVOKED (REVERT, CONFIRM of no record)
--   AGAIN    nothing changes; the record is written again for
--            --wait-replicas (replicate_again)
--   false    nothing
local CHANGES, REVOKES, AGAIN = 1, 2, 3

local function request_step(op, record, own, nonce)
  if not record then
    if op == 'revert' or op == 'confirm' then
      -- Empty rollback (REVERT), or a CONFIRM of nothing held: the id is
      -- revoked, so a late DEDUCT or HOLD of it takes nothing.
      return 4, REVOKES, '', 0
    end
    return 3, false, '', 0, 'no hold under this request_id on this sku'
  end
  local state = record.state
  if state == 'R' then
    if op == 'revert' then
      return record.nonce == nonce and 0 or 1, AGAIN, record.order_no, 0
    end
    return 4, AGAIN, '', 0
  end
  if state == 'V' then
    if op == 'revert' then
      return record.nonce == nonce and 4 or 1, AGAIN, '', 0
    end
    return 4, AGAIN, '', 0
  end
  if state == 'X' then
    -- The hold ran out: its units went back to stock then.
    return op == 'revert' and 1 or 5, own == 0 and AGAIN, record.order_no, record.expires
  end
  if op == 'revert' then
    -- DEDUCTED, HELD (in time) or CONFIRMED: every unit back.
    return 0, CHANGES, record.order_no, 0
  end
  if state == 'D' then
    return 3, false, '', 0, op == 'confirm'
      and 'request_id was used by a DEDUCT, which needs no CONFIRM'
      or 'request_id was used by a DEDUCT on this sku'
  end
  if state == 'C' then
    if op == 'shrink' then
      return 3, false, '', 0,
        'the hold was confirmed: its units are sold (REVERT gives them all back)'
    end
    if op == 'confirm' and record.nonce == nonce then
      -- This very call, sent again: it confirmed the first time.
      return 0, AGAIN, record.order_no, record.expires, '', 'confirmed'
    end
    return 1, AGAIN, record.order_no, record.expires
  end
  -- HELD, in time.
  return 0, CHANGES, record.order_no, record.expires, '',
    op == 'confirm' and 'confirmed' or (op == 'extend' and 'extended' or 'shrunk')
end

-- What a HOLD.EXTEND or HOLD.SHRINK (`op`) of `amount` (a number) makes of
-- a hold held in time (`record`), `now`: its new expiry and qty (a
-- string); or nil, then the code and reason to answer instead, nothing
-- changed (an order's line is extended "at least until", to its bound:
-- lua/change_hold.lua).
local function changed_hold(op, record, amount, now, settings, order_line)
  if op == 'extend' then
    local bound = record.held_at + settings.max_hold
    local expires = now + amount
    if expires > bound then
      if not order_line then
        return nil, 3, 'the hold may last until ' .. int_text(bound)
          .. ' at most (max hold ' .. settings.max_hold_arg .. ' ms from its start)'
      end
      expires = bound
    end
    if expires <= record.expires then
      if order_line then
        return nil, 1
      end
      return nil, 3, 'the hold already lasts until ' .. int_text(record.expires)
        .. ': an extension only moves it later'
    end
    return expires, record.qty
  end
  local held_qty = to_number(record.qty)
  if amount >= held_qty then
    return nil, 3, 'qty must be below the ' .. record.qty
      .. ' units held (REVERT gives every unit back)'
  end
  return record.expires, int_text(held_qty - amount)
end

-- The earliest expiry among the SKU's holds, or 0 when it has none.
local function earliest_hold(holds_key)
  local first = call('ZRANGE', holds_key, '0', '0', 'WITHSCORES')
  if first[2] then
    return to_number(first[2])
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
    -- without the trimming below.
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

-- How long a hold was held, never below 0: Redis time can step back (a
-- failover to a primary whose clock is behind the old one's), and a hold
-- then seems placed in the future.
local function held_for(record, now)
  local ms = now - record.held_at
  return ms > 0 and ms or 0
end

-- request_step for `op` on the request's `record` as read, once the
-- request's own hold that ran out (if it did) was released here, to its
-- stock (release_own) or to its locations (release_own_located, `locs`).
-- Redis time is asked (`now`: 0 when not asked yet) where a hold's
-- expiry decides, and for a CONFIRM's time held. What the step does but
-- CHANGES is done here (REVOKES writes the record REVOKED, AGAIN writes
-- it again for --wait-replicas), and its reply returned: the call's
-- answer. For CHANGES, which is the script's to do, returns nil, then
-- the record, the stock, the holds released and now after it, and the
-- event.
local function step_request(op, stock_key, record_key, record, nonce, stock, released, now,
    settings, journal_key, locs)
  local own = 0
  if record and (record.state == 'H' or op == 'confirm') then
    if now == 0 then
      now = now_ms()
    end
    if locs then
      local failed
      record, own, released, failed = release_own_located(stock_key, record_key, record, now,
        settings.window, journal_key, locs, released)
      if failed then
        return failed
      end
      stock = total_of(locs)
    else
      record, own, stock, released = release_own(stock_key, holds_name, held_name,
        record_key, record, now, settings.window, journal_key, stock, released)
    end
  end
  local code, does, order_no, expires, reason, event = request_step(op, record, own, nonce)
  if does == CHANGES then
    return nil, record, stock, released, now, event
  end
  if does == REVOKES then
    -- Remembered, so that a DEDUCT or HOLD of the id that comes late (an
    -- empty rollback's "hanging" try) takes nothing.
    call('SET', record_key, record_text('V', '0', nonce, '', ''), 'PX', settings.window_arg)
  elseif does == AGAIN then
    replicate_again(settings.replicate, record_key)
  end
  return answer(code, stock, order_no, reason, expires, released,
    event and held_for(record, now) or 0, event)
end


-- An operator's change, recorded under its op_id (STOCK.SET, STOCK.ADD):
-- "3:<kind>:<amount>:<nonce>:<after>:", kind A (added amount) or S (set to
-- amount), after the stock it left. Returns {kind, amount, nonce, after}.
local function parse_op(raw)
  local kind, amount, nonce, after = match(raw, '^3:([AS]):(%-?%d+):(%x*):(%-?%d*):$')
  if not kind then
    return nil
  end
  return {kind = kind, amount = amount, nonce = nonce, after = after}
end

-- `after` is text: a number goes through int_text first.
local function op_text(kind, amount, nonce, after)
  return '3:' .. kind .. ':' .. amount .. ':' .. nonce .. ':' .. after .. ':'
end
