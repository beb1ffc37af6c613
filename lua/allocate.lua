#!lua
--[[
stockgate by location: what is about choosing the locations of a SKU
whose stock is kept in named locations (docs/locations.md), and reading
and setting them, atomically in its slot.

The SKU's stock key holds the text "loc" (LOCATED); its locations are one
hash, <stock key>:loc (lua/common.lua says its fields, and how units move
between them). A record made here carries where its units came from
before the usual record: "@<location>=<units>,...;3:<state>:...", in the
order they were taken. REVERT, CONFIRM, HOLD.EXTEND and HOLD.SHRINK of a
request made here, and a hold's expiry, are the request state machine's
(lua/common.lua, request_step), which lua/revert.lua, lua/confirm.lua and
lua/change_hold.lua run for a SKU of either kind.

The operations, ARGV[1], and the keys each takes:
  deduct, hold       allocate qty over the named locations (DEDUCT.AT,
                     HOLD.AT)
    KEYS: the stock key, the request's record, the holds, held units,
    journal marker and journal (as lua/deduct.lua), the locations hash.
  set, add           STOCK.SET / STOCK.ADD ... AT <location>: KEYS as
                     above with the op record in the record's place; the
                     op record is "@<location>[=<floor>];" and then the
                     usual op record (lua/common.lua, op_text)
  get, locations, release
                     STOCK.GET (the total available), STOCK.LOCATIONS, the
                     sweeper's release: KEYS the stock key, the holds, held
                     units, journal marker, journal, the locations hash
  status             STOCK.STATUS of a request (sent on by stockgate after
                     lua/status.lua answered LOCATED): KEYS as for revert
ARGV[2]  settings    HOLD's, "<max hold> <window> <max qty> <missing>
                     <flags>" (lua/hold.lua ARGV[4])
ARGV[3]  nonce       1 to 32 hex digits (not for get, locations, release,
                     status)
then, by operation:
  deduct   qty, policy ("SPLIT" or "WHOLE"), location, ...
  hold     qty, policy, ttl_ms, location, ...
  set      qty, location, floor ("" keeps the floor it has)
  add      delta, location

Every call but set and add first gives the SKU's expired holds back to
their locations (at most RELEASE_BOUND), as any call on a SKU does
(lua/common.lua); an operator's change, as lua/stock_set.lua's, does not.
set makes a SKU one kept by location when it has no stock key yet, or its
one number is 0 with nothing held. set and add keep the SKU's total over
its locations within 2^53 - 1 (Lua's exact range, which every reply's total
is summed in): a change that would raise it past answers 3, as STOCK.ADD of
a one number does. Its op record (as lua/stock_set.lua's)
starts with the change's place, "@<location>[=<floor>];", so the same op_id
for another location or floor is another change (3).

Replies:
  deduct, hold  {code, total, "", VERSION, reason, expires_at, released, 0,
                event, 0, allocation}: answer()'s ten elements, whole (total
                is the SKU's available units over all locations), then
                {location, units, ...}, what each location gave (a retry:
                what the first call took); empty for 2 to 5
  set, add      {code, units at the location, "", VERSION[, reason]}
  get           {total, held, next expiry, released} (lua/get.lua's shape)
  locations     {total, {location, available, held, floor}, ...}; a SKU
                that keeps one number {stock}, one with none nil
  release       {released, next_at} (lua/release.lua's shape)
  status        lua/status.lua's shape, its stock the total available; nil
                when the SKU keeps its stock by location no more (stockgate
                asks lua/status.lua again)
Error replies (nothing changed): BADCALL; UNKNOWNSKU (no stock key);
BADRECORD; LOCGONE (a location a record or the call needs is missing from
the hash: deleted behind stockgate's back; never read as 0).
]]

--@common

local SETTINGS = {'max_hold', 'window', 'max_qty', 'missing'}
local SETTINGS_SHAPE = '^(%S+) (%S+) (%S+) (%S+) (%S+)$'
-- How many locations one call may name, and a SKU may have.
local CALL_LOCATIONS, SKU_LOCATIONS = 16, 64
local NOT_LOCATED = 'the sku keeps one number: DEDUCT and HOLD take from it'
local NO_LOCATIONS = 'the sku keeps its stock by location: name them (DEDUCT.AT, HOLD.AT)'

-- The checks and the read every operation makes: the settings, the keys,
-- the stock key (LOCATED, else UNKNOWNSKU or NOT_LOCATED), the journal,
-- the locations, and the SKU's expired holds given back. `first_side` is
-- where the holds key is in KEYS. Returns a table of what it found, or
-- nil and the reply to return.
local function open(KEYS, ARGV, first_side, with_record, op)
  local settings = SETTLED[ARGV[2]]
  if not settings then
    local bad
    settings, bad = settle(ARGV[2], SETTINGS, SETTINGS_SHAPE)
    if bad then
      return nil, bad
    end
  end
  local stock_key = KEYS[1]
  sku_keys(stock_key)
  local loc_key = KEYS[first_side + 4]
  if not find(stock_key, '{', 1, true) or KEYS[first_side] ~= holds_name
      or KEYS[first_side + 1] ~= held_name or KEYS[first_side + 2] ~= marker_name
      or KEYS[first_side + 3] ~= journal_name or loc_key ~= stock_key .. ':loc' then
    return nil, badcall('keys do not follow the stockgate key layout')
  end
  if with_record and not nonce_ok(ARGV[3]) then
    return nil, badcall('the call nonce must be 1 to 32 hex digits')
  end
  local got = call('MGET', stock_key, marker_name, held_name)
  if got[1] ~= LOCATED then
    if op == 'status' then
      -- Kept by location no more since lua/status.lua said it was (a
      -- write behind stockgate's back): stockgate asks that script again.
      return nil, false
    end
    if op == 'locations' then
      -- A SKU that keeps one number: its stock as stored, no locations.
      local stock = parse_stock(got[1])
      if stock == false then
        return nil, error_reply(BADSTOCK)
      end
      return nil, stock and {stock} or false
    end
    if got[1] then
      if op == 'deduct' or op == 'hold' then
        -- An allocation's reply is whole, with its (empty) allocation.
        return nil, {3, -1, '', VERSION, NOT_LOCATED, 0, 0, 0, '', 0, {}}
      end
      return nil, answer(3, -1, '', NOT_LOCATED)
    end
    return nil, error_reply(UNKNOWNSKU)
  end
  local journal_key = false
  if got[2] then
    journal_key = journal_name
  elseif settings.journal then
    return nil, error_reply(NOJOURNAL)
  end
  local locs = read_locations(loc_key)
  if #locs.names == 0 then
    -- The hash is gone (a SKU kept by location has one from its first
    -- STOCK.SET ... AT).
    return nil, error_reply(LOCGONE)
  end
  local now, released = 0, 0
  if got[3] and to_number(got[3]) > 0 then
    now = now_ms()
    local gone
    released, gone = release_due_located(stock_key, loc_key, locs, now, settings.window,
      journal_key)
    if gone then
      return nil, gone
    end
  end
  return {settings = settings, stock_key = stock_key, loc_key = loc_key, locs = locs,
          journal_key = journal_key, now = now, released = released}
end

-- The request's own record (KEYS[2]), read, and released first when it is
-- a hold that ran out (the bounded release may not have reached it).
-- Returns the record (nil when none), its allocation, and 1 when it was
-- released here; or false and the error to return.
local function own_record(c, record_key)
  local raw = call('GET', record_key)
  if not raw then
    return nil, {}, 0
  end
  local record = parse_located(raw)
  -- Only a revocation (REVOKED) names no locations: it took nothing.
  if not record or (not record.alloc and record.state ~= 'V') then
    return false, error_reply(BADRECORD)
  end
  local list = allocation_of(record.alloc)
  if record.state == 'H' then
    if c.now == 0 then
      c.now = now_ms()
    end
    if record.expires <= c.now then
      if not all_present(c.locs, list) then
        return false, error_reply(LOCGONE)
      end
      release_located(c.stock_key, c.loc_key, c.locs, record_key, record, list,
        c.settings.window, c.journal_key)
      record.state = 'X'
      c.released = c.released + 1
      return record, list, 1
    end
  end
  return record, list, 0
end

local NONE = {}

-- An allocation's reply (the header's shape): `list` what each location
-- gave, nil for none.
local function allocated(c, code, reason, expires, list, event)
  return {code, total_of(c.locs), '', VERSION, reason or '', expires or 0, c.released, 0,
          event or '', 0, list and allocation_flat(list) or NONE}
end

-- DEDUCT.AT and HOLD.AT.
local function allocate_call(c, KEYS, ARGV, hold)
  local record_key, nonce, qty_arg, policy = KEYS[2], ARGV[3], ARGV[4], ARGV[5]
  local settings, locs = c.settings, c.locs
  if not record_key_under(req_prefix, record_key) or KEYS[8] then
    return badcall('keys do not follow the stockgate key layout')
  end
  local qty = positive_int(qty_arg)
  if not qty or qty > settings.max_qty then
    return allocated(c, 3, 'qty must be an integer from 1 to ' .. settings.max_arg)
  end
  if policy ~= 'SPLIT' and policy ~= 'WHOLE' then
    return allocated(c, 3, 'policy must be SPLIT or WHOLE')
  end
  local ttl, first = nil, 6
  if hold then
    ttl, first = positive_int(ARGV[6]), 7
    if not ttl or ttl < 1000 or ttl > settings.max_hold then
      return allocated(c, 3, 'ttl_ms must be an integer from 1000 to ' .. settings.max_hold_arg)
    end
  end
  local named, seen = {}, {}
  for i = first, #ARGV do
    local name = ARGV[i]
    if not location_ok(name) then
      return allocated(c, 3, 'a location is 1 to 64 bytes of A-Z a-z 0-9 _ . -')
    end
    if seen[name] then
      return allocated(c, 3, 'location ' .. name .. ' is named twice')
    end
    seen[name] = true
    named[#named + 1] = name
  end
  if #named == 0 then
    return allocated(c, 3, NO_LOCATIONS)
  end
  if #named > CALL_LOCATIONS then
    return allocated(c, 3, 'at most ' .. CALL_LOCATIONS .. ' locations in one call')
  end

  local record, list, own = own_record(c, record_key)
  if record == false then
    return list
  end
  if record then
    local state = record.state
    if state == 'R' or state == 'V' then
      replicate_again(settings.replicate, record_key)
      return allocated(c, 4)
    end
    if hold and state == 'D' then
      return allocated(c, 3, 'request_id was used by a DEDUCT on this sku')
    end
    if not hold and state ~= 'D' then
      return allocated(c, 3, 'request_id was used by a HOLD on this sku')
    end
    if state == 'X' then
      if own == 0 then
        replicate_again(settings.replicate, record_key)
      end
      return allocated(c, 5, nil, record.expires)
    end
    local asked = record.asked or record.qty
    if asked ~= qty_arg then
      return allocated(c, 3, 'request_id was already used with qty ' .. asked .. ' on this sku')
    end
    replicate_again(settings.replicate, record_key)
    if record.nonce == nonce and (state == 'D' or state == 'H') then
      return allocated(c, 0, nil, record.expires, list, hold and 'placed' or '')
    end
    return allocated(c, 1, nil, record.expires, list)
  end

  -- The allocation: which location gives how many, decided before any
  -- write.
  local take, left = {}, qty
  for i = 1, #named do
    local name = named[i]
    local units = locs.units[name]
    if units == nil then
      return allocated(c, 3, 'unknown location ' .. name)
    end
    local free = units - (locs.floor[name] or 0)
    if left > 0 and free > 0 then
      if policy == 'SPLIT' then
        local n = free < left and free or left
        take[#take + 1] = {name, n}
        left = left - n
      elseif free >= qty then
        take[1], left = {name, qty}, 0
      end
    end
  end
  if left > 0 then
    return allocated(c, 2)
  end

  -- Writes: only after every check above has passed.
  local id = sub(record_key, #req_prefix + 1)
  for i = 1, #take do
    if hold then
      move(c.loc_key, locs, take[i][1], -take[i][2], take[i][2], c.journal_key, 'hold', id, '')
    else
      move(c.loc_key, locs, take[i][1], -take[i][2], 0, c.journal_key, 'deduct', id, '')
    end
  end
  if hold then
    if c.now == 0 then
      c.now = now_ms()
    end
    local expires = c.now + ttl
    local expires_text = int_text(expires)
    call('INCRBY', held_name, qty_arg)
    call('ZADD', holds_name, expires_text, id)
    call('SET', record_key,
      located_text(take, 'H', qty_arg, nonce, expires_text .. '.' .. int_text(c.now), ''))
    return allocated(c, 0, nil, expires, take, 'placed')
  end
  call('SET', record_key, located_text(take, 'D', qty_arg, nonce, '', ''), 'PX',
    settings.window_arg)
  return allocated(c, 0, nil, 0, take)
end

-- STOCK.STATUS of a request on a SKU kept by location: lua/status.lua's
-- reply, its stock the SKU's total available (what STOCK.GET answers). A
-- hold of the request's that ran out is given back first, as any call on
-- the request does. A record made before the SKU was kept by location
-- (no allocation in it) is shown as it is: it holds no unit here.
local function status_call(c, KEYS)
  local record_key = KEYS[2]
  if not record_key_under(req_prefix, record_key) or KEYS[8] then
    return badcall('keys do not follow the stockgate key layout')
  end
  local raw = call('GET', record_key)
  local record = raw and parse_located(raw)
  if raw and not record then
    return error_reply(BADRECORD)
  end
  if record and record.alloc and record.state == 'H' then
    local refused
    record, refused = own_record(c, record_key)
    if record == false then
      return refused
    end
  end
  local held = to_number(call('GET', held_name) or '0')
  local next_expiry = earliest_hold(holds_name)
  local total = total_of(c.locs)
  if not record then
    return {'none', 0, '', -2, total, held, next_expiry, 0, c.released}
  end
  return {STATE_NAMES[record.state], to_number(record.qty), record.order_no,
          call('PTTL', record_key), total, held, next_expiry, record.expires, c.released}
end

-- STOCK.SET and STOCK.ADD ... AT <location>: an operator's change of one
-- location, once per op_id (lua/stock_set.lua and lua/stock_add.lua have
-- the rules, which these follow).
local function operator_call(KEYS, ARGV, op)
  local settings = SETTLED[ARGV[2]]
  if not settings then
    local bad
    settings, bad = settle(ARGV[2], SETTINGS, SETTINGS_SHAPE)
    if bad then
      return bad
    end
  end
  local stock_key, op_key, nonce = KEYS[1], KEYS[2], ARGV[3]
  local loc_key = KEYS[7]
  sku_keys(stock_key)
  if not op_key_follows_layout(stock_key, op_key) or not side_keys_follow(
      {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}, 3)
      or loc_key ~= stock_key .. ':loc' or KEYS[8] then
    return badcall('keys do not follow the stockgate key layout')
  end
  if not nonce_ok(nonce) then
    return badcall('the call nonce must be 1 to 32 hex digits')
  end
  local amount_arg, name, floor_arg = ARGV[4], ARGV[5], ARGV[6] or ''
  local amount = nil
  if amount_arg and #amount_arg <= 17 and find(amount_arg, '^%-?%d+$') then
    amount = to_number(amount_arg)
  end
  if op == 'set' and (not amount or amount < 0 or amount > EXACT
      or (amount_arg ~= '0' and not positive_int(amount_arg))) then
    return {3, -1, '', VERSION, 'stock must be an integer from 0 to 2^53 - 1'}
  end
  if op == 'add' and (not amount or amount > EXACT or amount < -EXACT) then
    return {3, -1, '', VERSION, 'delta must be an integer within +-(2^53 - 1)'}
  end
  if not location_ok(name) then
    return {3, -1, '', VERSION, 'a location is 1 to 64 bytes of A-Z a-z 0-9 _ . -'}
  end
  local floor = nil
  if floor_arg ~= '' then
    floor = (floor_arg == '0' and 0) or positive_int(floor_arg)
    if op ~= 'set' or not floor then
      return {3, -1, '', VERSION, 'floor must be an integer from 0 to the stock set'}
    end
  end

  local got = call('MGET', stock_key, marker_name, op_key, held_name)
  local current, raw = got[1], got[3]
  -- A SKU that keeps one number becomes one kept by location only when
  -- empty: its one number 0 and no unit on hold.
  local converts = op == 'set' and current == '0' and (got[4] or '0') == '0'
  if current and current ~= LOCATED and not converts then
    return {3, -1, '', VERSION, NOT_LOCATED .. ' (STOCK.SET without AT sets it; set to 0 with'
      .. ' nothing held, STOCK.SET ... AT makes it one kept by location)'}
  end
  local journal_key = false
  if got[2] then
    journal_key = journal_name
  elseif settings.journal then
    return error_reply(NOJOURNAL)
  end
  if current == LOCATED and call('EXISTS', loc_key) == 0 then
    return error_reply(LOCGONE)
  end
  local locs = read_locations(loc_key)
  local units = locs.units[name]
  -- The op record names the change's place: the location, and the floor
  -- a STOCK.SET gave it, so that an op_id sent again for another location
  -- or floor is another change, not a retry.
  local place = name .. (floor and '=' .. floor_arg or '')
  if raw then
    local done_place, rest = match(raw, '^@([^;]*);(.*)$')
    local done = parse_op(rest or raw)
    if not done then
      return error_reply(BADRECORD)
    end
    local kind = op == 'set' and 'S' or 'A'
    if done.kind ~= kind or done.amount ~= amount_arg or done_place ~= place then
      return {3, units or -1, '', VERSION, 'op_id was already used for another change on this sku'}
    end
    replicate_again(settings.replicate, op_key)
    return {done.nonce == nonce and 0 or 1, units or -1, '', VERSION}
  end
  if op == 'add' and units == nil then
    return {3, -1, '', VERSION, 'unknown location ' .. name}
  end
  if units == nil and #locs.names >= SKU_LOCATIONS then
    return {3, -1, '', VERSION, 'a sku has at most ' .. SKU_LOCATIONS .. ' locations'}
  end
  local after = op == 'set' and amount or units + amount
  if after < 0 then
    return {2, units, '', VERSION}
  end
  -- Every total a reply shows is summed here, in doubles: exact while it
  -- is within 2^53 - 1, so no change raises it past that (one that lowers
  -- it always passes).
  local before = units or 0
  if after > before and total_of(locs) - before + after > EXACT then
    return {3, units or -1, '', VERSION,
      'the sku\'s total over its locations would exceed 2^53 - 1'}
  end
  if floor and floor > after then
    return {3, units or -1, '', VERSION, 'floor ' .. floor_arg .. ' is above the ' .. amount_arg
      .. ' units the location would hold'}
  end

  -- Writes: only after every check above has passed.
  if current ~= LOCATED then
    call('SET', stock_key, LOCATED)
  end
  local op_id = sub(op_key, #stock_key + 5)
  call('HSET', loc_key, name, int_text(after))
  if floor then
    call('HSET', loc_key, name .. ':floor', floor_arg)
  end
  if journal_key then
    local ds = op == 'set' and after - (units or 0) or amount
    local entry = '2 ' .. (op == 'set' and 'set' or 'add') .. ' ' .. op_id .. ' '
      .. int_text(ds) .. ' 0 ' .. int_text(after) .. ' ' .. int_text(locs.held[name] or 0)
      .. ' ' .. name .. ' '
    call('XADD', journal_key, 'NOMKSTREAM', '*', 'e', entry)
  end
  call('SET', op_key, '@' .. place .. ';'
    .. op_text(op == 'set' and 'S' or 'A', amount_arg, nonce, int_text(after)),
    'PX', settings.window_arg)
  return {0, after, '', VERSION}
end

local function allocate(KEYS, ARGV)
  if not call then
    bind()
  end
  bind_located()
  local op = ARGV[1]
  if op == 'set' or op == 'add' then
    return operator_call(KEYS, ARGV, op)
  end
  if op == 'status' then
    local c, refused = open(KEYS, ARGV, 3, false, op)
    if not c then
      return refused
    end
    return status_call(c, KEYS)
  end
  local sku_op = op == 'get' or op == 'locations' or op == 'release'
  local request_op = op == 'deduct' or op == 'hold'
  if not sku_op and not request_op then
    return badcall('unknown operation')
  end
  local c, refused = open(KEYS, ARGV, sku_op and 2 or 3, request_op, op)
  if not c then
    return refused
  end
  if request_op then
    return allocate_call(c, KEYS, ARGV, op == 'hold')
  end
  if KEYS[7] then
    return badcall('keys do not follow the stockgate key layout')
  end
  if op == 'release' then
    return {c.released, earliest_hold(holds_name)}
  end
  if op == 'get' then
    return {total_of(c.locs), to_number(call('GET', held_name) or '0'), earliest_hold(holds_name),
            c.released}
  end
  local names = c.locs.names
  sort(names)
  local reply = {total_of(c.locs)}
  for i = 1, #names do
    local name = names[i]
    reply[i + 1] = {name, c.locs.units[name], c.locs.held[name] or 0, c.locs.floor[name] or 0}
  end
  return reply
end

return allocate(KEYS, ARGV)
