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
error reply in the reply where lua/deduct.lua would have answered an
error (a stock value that is not an integer is each member's BADSTOCK, after
that member's own argument checks, as in lua/deduct.lua). A fault in
stockgate's shared arguments (lua/deduct.lua checks its settings first) is
one error reply for the whole call, which is what each member's own call
would have answered. Writes happen in member
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
KEYS[4]    journal marker    <prefix>:{<sku>}:journal:on  (declared: lua/common.lua, request_fault)
KEYS[5]    journal           <prefix>:{<sku>}:journal     (declared likewise)
KEYS[5+i]  member i's record <prefix>:{<sku>}:req:<request_id>   (i = 1..n)
           (one hash tag: every key lives in the SKU's slot)

ARGV[1]    retry window      the words of lua/deduct.lua's settings, one
ARGV[2]    max qty           argument each (a coalesced call's shared
ARGV[3]    missing stock     arguments cost once for all its members)
ARGV[4]    replicate         "1" with --wait-replicas, else "0"
ARGV[5]    journal           "1" with --journal, else "0"
ARGV[3+3i] member i's qty       as lua/deduct.lua ARGV[1]
ARGV[4+3i] member i's order_no  as ARGV[2]
ARGV[5+3i] member i's nonce     as ARGV[4]

Reply: one flat array of the n members' replies in order, each
lua/deduct.lua's reply or error reply: for a reply, the count of its
elements, then its elements; for an error reply, 0, then the error; for
the commonest, {0, remain, order_no, VERSION}, -1 - remain (below 0, as
no count is), then order_no. Flat, not an array of arrays: Redis converts each table of a
reply with six lookups of its own (an error? a status? a double? ...),
about 2k instructions a member, and each element for about 0.5k;
src/stock/coalesce.rs splits it into the members' own replies. The released count (expired holds given back first) is on
the reply of the member whose call would have released them. Error replies
for the whole call: BADCALL (the shared arguments, or the key and argument
counts disagree). With no members (n = 0) the reply is an empty array and
nothing is read or written: stockgate sends that to load the script again
on a node that answered NOSCRIPT.
]]

--@common

-- Appends a member's reply (a table: an array reply, or an error reply
-- {err = ...}) to the flat reply `out`, which holds `o` elements; returns
-- how many it holds then.
local function put(out, o, reply)
  if reply.err then
    out[o + 1], out[o + 2] = 0, reply
    return o + 2
  end
  local n = #reply
  out[o + 1] = n
  for j = 1, n do
    out[o + 1 + j] = reply[j]
  end
  return o + 1 + n
end

-- The flat reply of a library's last call, reused: its array part keeps
-- its size from call to call, and a call ends its reply with a nil (Redis
-- reads an array reply up to its first nil).
local OUT = {}

local function deduct_many(KEYS, ARGV)
  if not call then
    bind()
  end
  local stock_key, holds_key, held_key, marker_key, journal_key_named =
    KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
  local window_arg, max_arg, missing, replicate = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
  local n = #KEYS - 5

  -- What the members share, checked once, as lua/deduct.lua checks its
  -- settings: before anything of a member's own, so a fault in any is
  -- every member's answer.
  if n < 0 or #ARGV ~= 5 + 3 * n then
    return badcall('a coalesced DEDUCT takes 5 + n keys and 5 + 3n arguments')
  end
  local window = known_window_ms
  if window_arg ~= known_window then
    window = window_ms(window_arg)
    if not window then
      return badcall('retry window must be at least 60000 ms')
    end
  end
  local max_qty = known_max_qty
  if max_arg ~= known_max then
    max_qty = max_qty_of(max_arg)
    if not max_qty then
      return badcall('max qty must be a positive integer')
    end
  end
  if missing ~= 'error' and missing ~= 'zero' then
    return badcall('missing-stock mode must be "error" or "zero"')
  end
  local bad = bad_replicate(replicate)
  if bad then
    return bad
  end
  replicate = replicate == '1'
  if stock_key ~= known_stock then
    sku_keys(stock_key)
  end
  if holds_key ~= holds_name or held_key ~= held_name or marker_key ~= marker_name
      or journal_key_named ~= journal_name then
    return badcall('keys do not follow the stockgate key layout')
  end
  if n == 0 then
    -- No members: what stockgate sends to cache this script on a node that
    -- lost it (EVAL of the body).
    return {}
  end
  -- One read for the whole group: the stock, the held units, the
  -- journal's marker (lua/common.lua, journal_of), every record.
  local read = call('MGET', stock_key, held_key, marker_name, unpack_all(KEYS, 6))
  local journal_key = read[3] and journal_name
  if ARGV[5] == '1' and not journal_key then
    -- Once for the call: with the journal on, its absence refuses the
    -- whole call, before anything is written.
    return error_reply(NOJOURNAL)
  end
  local stock = parse_stock(read[1])
  local held = read[2]
  held = held and to_number(held) or 0

  -- Every member's record key must lie under req_prefix (lua/common.lua,
  -- keys_follow_layout, written out), made once for the SKU.
  local prefix_len = #req_prefix
  local out, o = OUT, 0
  -- Records this call wrote, by key: a request_id listed twice finds the
  -- first member's record, as its own later call would. Made only when a
  -- later member could ask.
  local written = nil
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
  local the_held = held > 0 and held or 0

  for i = 1, n do
    local record_key = KEYS[5 + i]
    local base = 3 + 3 * i
    local qty_arg, order_no, nonce = ARGV[base], ARGV[base + 1], ARGV[base + 2]
    local reply = nil
    local qty = known_qty_n
    if qty_arg ~= known_qty then
      qty = qty_of(qty_arg)
    end
    if #record_key <= prefix_len or find(record_key, req_prefix, 1, true) ~= 1 then
      reply = badcall('keys do not follow the stockgate key layout')
    elseif not nonce or #nonce > 32 or not find(nonce, '^%x+$') then
      reply = badcall('the call nonce must be 1 to 32 hex digits')
    elseif not qty or qty > max_qty then
      reply = answer(3, nil, '', 'qty must be an integer from 1 to ' .. max_arg)
    elseif not order_no or #order_no > 128 or find(order_no, '[^ -~]') then
      reply = answer(3, nil, '', 'order_no must be at most 128 printable ASCII bytes')
    elseif stock == false then
      reply = error_reply(read[1] == LOCATED and LOCATEDSKU or BADSTOCK)
    else
      local raw = written and written[record_key] or read[3 + i]
      local record = raw and parse_record(raw)
      if raw and not record then
        reply = error_reply(BADRECORD)
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
              call('DECRBY', stock_key, owed)
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
            the_held = held > 0 and held or 0
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
          local state = record.state
          if state == 'R' or state == 'V' then
            replicate_again(replicate, record_key)
            reply = answer(4, stock, '', '', 0, released)
          elseif state ~= 'D' then
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
            reply = error_reply(UNKNOWNSKU)
          end
        elseif stock < qty then
          reply = answer(2, stock, '', '', 0, released, 0, '', the_held)
        elseif decr_failed then
          reply = decr_failed
        else
          if deducted_once then
            owed = owed + qty
            stock = stock - qty
          else
            -- The first deduction writes the stock itself, as lua/deduct.lua
            -- does, so a value Redis refuses is found before any record.
            local remain = rpcall('DECRBY', stock_key, qty_arg)
            if type_of(remain) == 'table' then
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
              journal(journal_key, 'deduct', sub(record_key, prefix_len + 1), '-' .. qty_arg, '0',
                stock, the_held, order_no)
            end
            local text = record_text('D', qty_arg, nonce, '', order_no)
            call('SET', record_key, text, 'PX', window_arg)
            if i < n then
              written = written or {}
              written[record_key] = text
            end
            if released > 0 then
              reply = answer(0, stock, order_no, '', 0, released)
            else
              -- The commonest reply, written straight into the flat one.
              out[o + 1], out[o + 2] = -1 - stock, order_no
              o = o + 2
            end
          end
        end
      end
    end
    if reply then
      o = put(out, o, reply)
    end
    -- The next member's own call would read the stock again: released
    -- holds can take it past what parse_stock accepts, and then that call
    -- answers BADSTOCK.
    if stock and (stock > EXACT or stock < -EXACT) then
      stock = false
    end
  end

  if owed > 0 then
    call('DECRBY', stock_key, owed)
  end
  out[o + 1] = nil
  return out
end

return deduct_many(KEYS, ARGV)
