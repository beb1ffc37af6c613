#!lua
--[[
stockgate DEDUCT, coalesced: the DEDUCTs of one SKU that were waiting for
its primary at the same moment, run as one call (src/stock/coalesce.rs).

Member i's reply is exactly what lua/deduct.lua would answer to member i's
own call, had the members' calls run one after another in this order: the
stock each one sees is what the members before it left, and a request_id
that appears twice is a duplicate the second time. Why one call: a script
call's fixed cost (the call itself, the chunk's closures, the argument
checks that every member shares, the reads of the stock and held keys) is
paid once for the group instead of once per deduction, and on a hot SKU
that fixed cost is most of what a deduction costs Redis.

Nothing raised halfway through: Redis does not roll a script back when it
raises, so everything that can fail for one member (its arguments, its
record's shape, a missing stock key) becomes that member's own reply, an
error reply nested in the array where lua/deduct.lua would have answered an
error (a stock value that is not an integer is each member's BADSTOCK, after
that member's own argument checks, as in lua/deduct.lua). A fault in
stockgate's shared arguments is one error reply for the whole call, which is
what each member's own call would have answered. Writes happen in member
order, after that member's checks: the records one by one, the stock once
at the first deduction (as lua/deduct.lua's DECRBY) and once at the end for
the rest, or before a release when one comes in between (next paragraph).

Expired holds go back as the members' own calls would give them back: each
member that passes its own checks (arguments, BADSTOCK, BADRECORD) releases
the SKU's due holds first, at most RELEASE_BOUND of them (lua/common.lua,
release_due), so a backlog longer than that goes back over several members
as over several calls, and each member's reply carries its own released
count. A release adds to the stock key, so the units deducted before it are
written first, and the member's deduction after it is a DECRBY of its own:
the key then holds at every step what the separate calls would have left.
A SKU with no units held (none in the one read; no member adds any) never
asks: per member, that costs what it did before holds existed. Once a
release leaves the SKU's earliest hold expiring after the Redis time that
release read, no later member asks either (one ZRANGE): at that instant
their calls would find nothing due.

KEYS[1]    stock key         <prefix>:{<sku>}
KEYS[2]    holds             <prefix>:{<sku>}:holds
KEYS[3]    held units        <prefix>:{<sku>}:held
KEYS[3+i]  member i's record <prefix>:{<sku>}:req:<request_id>   (i = 1..n)
           (one hash tag: every key lives in the SKU's slot)

ARGV[1]    retry window      as lua/deduct.lua ARGV[3]
ARGV[2]    max qty           as ARGV[4]
ARGV[3]    missing stock     as ARGV[5]
ARGV[4]    replicate         as ARGV[7]
ARGV[5]    journal           as ARGV[8]
ARGV[3+3i] member i's qty       as lua/deduct.lua ARGV[1]
ARGV[4+3i] member i's order_no  as ARGV[2]
ARGV[5+3i] member i's nonce     as ARGV[6]

Reply: an array of n replies, member i's at i, each lua/deduct.lua's reply
or error reply. The released count (expired holds given back first) is on
the reply of the member whose call would have released them. Error replies
for the whole call: BADCALL (the shared arguments, or the key and argument
counts disagree). With no members (n = 0) the reply is an empty array and
nothing is read or written: stockgate sends that to load the script again
on a node that answered NOSCRIPT.
]]

--@common

local stock_key, holds_key, held_key = KEYS[1], KEYS[2], KEYS[3]
local window_arg, max_arg, missing, replicate = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = #KEYS - 3

-- What the members share, checked once, in lua/deduct.lua's order: the
-- window and the mode come before any member's own checks there, so a
-- fault in either is every member's answer.
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
local journal_key = false
if n > 0 then
  -- Once for the call (lua/common.lua, journal_of): with the journal on,
  -- its absence refuses the whole call, before anything is read.
  local refused
  journal_key, refused = journal_of(stock_key, ARGV[5])
  if refused then
    return refused
  end
end
-- These two come after each member's key and nonce checks in
-- lua/deduct.lua: a member whose own check fails answers that instead.
local late = bad_replicate(replicate)
local max_qty = positive_int(max_arg)
if not late and not max_qty then
  late = badcall('max qty must be a positive integer')
end
if n == 0 then
  -- No members: what stockgate sends to cache this script on a node that
  -- lost it (EVAL of the body).
  return {}
end

-- One read for the whole group: the stock, the held units, every record.
local read = redis.call('MGET', stock_key, held_key, unpack(KEYS, 4))
local stock = parse_stock(read[1])
local held = tonumber(read[2]) or 0

-- Every member's record key must lie under this (lua/common.lua,
-- keys_follow_layout), built once for the call.
local record_prefix = stock_key .. ':req:'
local replies = {}
-- Records this call wrote, by key: a request_id listed twice finds the
-- first member's record, as its own later call would.
local written = {}
-- Expired holds: every member that gets as far as its own call's release
-- releases again, at most RELEASE_BOUND of them, as that call would. A
-- SKU with no units held (held 0 in the read above; no member adds any)
-- or no stock key never releases: that member's check is this flag.
local releasing = held > 0 and stock ~= nil
-- Redis time at the last release, once there was one: when the SKU's
-- earliest hold expires after it, no later member's call would find
-- anything due, and none asks again.
local released_at = nil
-- Units deducted since the first deduction's DECRBY.
local owed = 0
-- The first deduction's DECRBY failed (a stock value Lua reads as an
-- integer but Redis does not, such as "007"): every later deduction
-- answers that error too, as its own call would.
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
      -- A SKU with no holds pays this one test per member.
      if releasing then
        if released_at then
          -- A member released before this one: anything due still?
          local earliest = earliest_hold(holds_key)
          releasing = earliest ~= 0 and earliest <= released_at
        end
        if releasing then
          if owed > 0 then
            -- A release adds to the stock key: the units deducted since
            -- the first DECRBY go first, so it adds to what this member's
            -- own call would find there.
            redis.call('DECRBY', stock_key, owed)
            owed = 0
          end
          local units
          stock, released, released_at, units = release_due(stock_key, holds_key, held_key,
            stock, held, window, journal_key)
          -- The held units went down by what went back to stock (the
          -- counter is deleted at 0 or below, so "above 0" is what the
          -- next member's own call reads there; the holds set may still
          -- hold entries then, so it is not asked). The units the release
          -- counted, not the stock's difference: past 2^53 a double
          -- rounds it, and a member would release again where its own
          -- call would not.
          held = held - units
          releasing = held > 0
          if units > 0 then
            -- This member deducts with a DECRBY of its own, as the first
            -- deduction does: its remain is Redis's, exact even where the
            -- release took the stock past 2^53.
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
          -- A nonce of its own: this very call, sent again, deducted the
          -- first time (only a resend through the slow path can be).
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
          -- The first deduction writes the stock itself, as lua/deduct.lua
          -- does, so a value Redis refuses is found before any record.
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
            -- Written with no global (string, math): lua/common.lua, journal_entry.
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
  -- The next member's own call would read the stock again: released
  -- holds can take it past what parse_stock accepts, and then that call
  -- answers BADSTOCK.
  if stock and (stock > EXACT or stock < -EXACT) then
    stock = false
  end
end

if owed > 0 then
  redis.call('DECRBY', stock_key, owed)
end
return replies
