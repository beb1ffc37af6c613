#!lua
--[[
stockgate REVERT.

Gives back what one request deducted, at most once, atomically; and guards
against the two hazards of compensation (as in TCC / Seata):
  empty rollback  a REVERT arrives for a DEDUCT that never happened: it is
                  recorded as REVOKED and gives nothing back;
  hanging         a DEDUCT arrives after its REVERT: REVOKED (or REVERTED)
                  refuses it with code 4 (see lua/deduct.lua).

Each (sku, request_id) is a small state machine kept in its idempotency
record (format in lua/common.lua), always with the retry-window TTL:

  state now   DEDUCT                          REVERT
  none        deduct -> DEDUCTED, 0 (or 2)    -> REVOKED, 4 (UNKNOWNSKU when
                                              the sku has no stock at all)
  DEDUCTED    1 (duplicate)                   give qty back -> REVERTED, 0
  REVERTED    4 (revoked)                     1 (duplicate)
  REVOKED     4                               1

The qty given back is read from the record, never from the caller. A
REVERTED or REVOKED record gets a full retry window from the moment of the
REVERT, so the update never shortens its TTL. Every read and check happens
before the first write. A call sent again after its connection was lost
finds its own nonce in the record and answers what it answered the first
time (0 given back, 4 revoked), not 1.

KEYS[1]  stock key           <prefix>:{<sku>}
KEYS[2]  idempotency record  <prefix>:{<sku>}:req:<request_id>
ARGV[1]  retry window        milliseconds, at least 60000
ARGV[2]  missing stock       "error" or "zero"
ARGV[3]  nonce               1 to 32 hex digits, new for every call
ARGV[4]  replicate           "1" with --wait-replicas, "0" (or absent): a reply
                             stating an existing record (0 and 4 for a call
                             sent again, 1) writes it again unchanged, so the
                             WAIT after it confirms it (lua/common.lua)

Replies, the same shape as DEDUCT's:
  {0, remain, order_no, VERSION}   given back; remain is the stock after it,
                                   order_no the one the DEDUCT stored
  {1, stock, order_no, VERSION}    duplicate: already reverted (order_no of the
                                   DEDUCT) or already revoked (""); nothing changed
  {4, stock, "", VERSION}          revoked: nothing had been deducted; the id
                                   is now refused by DEDUCT
(stock is -1 where it was not read or the stock key is missing.)
Error replies (nothing changed):
  BADCALL ...     an argument stockgate supplies is wrong (ARGV, the keys)
  UNKNOWNSKU ...  the stock key does not exist and ARGV[2] is "error": a
                  REVERT naming a sku with no stock is far likelier a wrong
                  sku than an empty rollback, and answering 4 ("nothing to
                  give back") would let the real deduction go unreturned
  BADSTOCK ...    the stock value is not an integer
  BADRECORD ...   the record has a shape this version can't read
]]

--@common

local stock_key = KEYS[1]
local record_key = KEYS[2]
local missing, nonce, replicate = ARGV[2], ARGV[3], ARGV[4]

local window, bad = own_args(stock_key, record_key, ARGV[1], missing, nonce)
if not window then
  return bad
end
bad = bad_replicate(replicate)
if bad then
  return bad
end

local stock = read_stock(stock_key)
if stock == false then
  return redis.error_reply(BADSTOCK)
end

local raw = redis.call('GET', record_key)
if not raw then
  if stock == nil and missing ~= 'zero' then
    return redis.error_reply(UNKNOWNSKU)
  end
  -- Empty rollback: nothing to give back, but remember the id so a late
  -- DEDUCT of it is refused instead of deducting after its cancel.
  redis.call('SET', record_key, record_text('V', '0', nonce, '', ''), 'PX', window)
  return {4, stock or -1, '', VERSION}
end

local record = parse_record(raw)
if not record then
  return redis.error_reply(BADRECORD)
end
if record.state == 'R' then
  replicate_again(replicate, record_key, raw)
  local code = record.nonce == nonce and 0 or 1
  return {code, stock or -1, record.order_no, VERSION}
end
if record.state == 'V' then
  replicate_again(replicate, record_key, raw)
  local code = record.nonce == nonce and 4 or 1
  return {code, stock or -1, '', VERSION}
end
if stock == nil and missing ~= 'zero' then
  return redis.error_reply(UNKNOWNSKU)
end

-- Writes: only after every check above has passed.
local remain = redis.call('INCRBY', stock_key, record.qty)
redis.call('SET', record_key, record_text('R', record.qty, nonce, '', record.order_no), 'PX', window)
return {0, remain, record.order_no, VERSION}
