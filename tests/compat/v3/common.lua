-- stockgate's shared script helpers. stockgate inserts this file into each
-- script where the script says --@common, so every script applies the same
-- rules; the text Redis runs (and its SHA) includes it.

-- The version of the script set: the fourth element of every reply.
-- 3: records carry the call's nonce; stockgate's own arguments, when
-- wrong, are a BADCALL error, never code 3.
local VERSION = 3
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

-- The record key must be the stock key plus ":req:<request_id>", so both
-- share the stock key's hash tag. Returns true when it is.
local function keys_follow_layout(stock_key, record_key)
  local prefix = stock_key .. ':req:'
  local request_id = string.sub(record_key, #prefix + 1)
  return string.find(stock_key, '{', 1, true) ~= nil
    and string.sub(record_key, 1, #prefix) == prefix
    and #request_id >= 1 and #request_id <= 128
    and not string.find(request_id, '[^!-~]')
    and not string.find(request_id, '[{}]')
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

-- An error for an argument stockgate itself supplies (not the caller): a
-- version mismatch between stockgate and its scripts, or a bug. Never a
-- business code: the caller must not take it for "invalid parameters".
local function badcall(what)
  return redis.error_reply('BADCALL ' .. what .. ' (stockgate supplies it: a version mismatch or a bug); nothing was changed')
end

-- The checks every stock script makes of what stockgate supplies: the
-- window, the missing-stock mode, the key layout and the call's nonce.
-- Returns the window, or nil and the BADCALL error to return.
local function own_args(stock_key, record_key, window_arg, missing, nonce)
  local window = window_ms(window_arg)
  if not window then
    return nil, badcall('retry window must be at least 60000 ms')
  end
  if missing ~= 'error' and missing ~= 'zero' then
    return nil, badcall('missing-stock mode must be "error" or "zero"')
  end
  if not keys_follow_layout(stock_key, record_key) then
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
-- --wait-replicas.
local function replicate_again(flag, key, raw)
  if flag ~= '1' then
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
local function read_stock(stock_key)
  local raw = redis.call('GET', stock_key)
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

local BADSTOCK = 'BADSTOCK stock value is not an integer; nothing was changed'
local BADRECORD = 'BADRECORD idempotency record has an unknown shape; nothing was changed'
local UNKNOWNSKU = 'UNKNOWNSKU no stock is recorded for this sku; nothing was changed'

-- An idempotency record, one string with a TTL. States:
--   D  DEDUCTED  qty units were deducted
--   R  REVERTED  qty units were deducted, then given back
--   V  REVOKED   a REVERT came first (qty 0); this id may never deduct
--
-- Written as "3:<state>:<qty>:<nonce>:<aux>:<order_no>" (aux is empty for
-- these states). The nonce names the call that wrote it: a call sent again
-- after its connection was lost finds its own nonce and answers what it
-- answered the first time, not "duplicate". Scripts of version 2 and older
-- read only "<state>:<qty>:<order_no>", which stockgate no longer writes;
-- they answer BADRECORD for a version-3 record (an error, never a code)
-- because "3" is no state they know.
--
-- Returns {state, qty (string), nonce, aux, order_no}, or nil for any
-- other shape. Older records read with an empty nonce and aux.
local function parse_record(raw)
  local state, qty, nonce, aux, order_no =
    string.match(raw, '^3:([DRV]):(%d+):(%x*):(%d*):(.*)$')
  if state then
    return {state = state, qty = qty, nonce = nonce, aux = aux, order_no = order_no}
  end
  state, qty, order_no = string.match(raw, '^([DRV]):(%d+):(.*)$')
  if state then
    return {state = state, qty = qty, nonce = '', aux = '', order_no = order_no}
  end
  return nil
end

local function record_text(state, qty, nonce, aux, order_no)
  return '3:' .. state .. ':' .. qty .. ':' .. nonce .. ':' .. aux .. ':' .. order_no
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
