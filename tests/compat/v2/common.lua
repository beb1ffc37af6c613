-- stockgate's shared script helpers. stockgate inserts this file into each
-- script where the script says --@common, so every script applies the same
-- rules; the text Redis runs (and its SHA) includes it.

-- The version of the script set: the fourth element of every reply.
local VERSION = 2
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

-- The checks DEDUCT and REVERT share: the window, the missing-stock mode
-- and the key layout. Returns the window, or nil and the code-3 reason.
local function shared_args(stock_key, record_key, window_arg, missing)
  local window = window_ms(window_arg)
  if not window then
    return nil, 'retry window must be at least 60000 ms'
  end
  if missing ~= 'error' and missing ~= 'zero' then
    return nil, 'missing-stock mode must be "error" or "zero"'
  end
  if not keys_follow_layout(stock_key, record_key) then
    return nil, 'keys do not follow the stockgate key layout'
  end
  return window
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

-- An idempotency record is "<state>:<qty>:<order_no>":
--   D  DEDUCTED  qty units were deducted
--   R  REVERTED  qty units were deducted, then given back
--   V  REVOKED   a REVERT came first (qty 0); this id may never deduct
-- Returns state, qty (string), order_no; state is nil for any other shape.
local function parse_record(raw)
  local state, qty, order_no = string.match(raw, '^([DRV]):(%d+):(.*)$')
  return state, qty, order_no
end
