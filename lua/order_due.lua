#!lua
--[[
stockgate's orders in flight, one shard (src/stock/order/recovery.rs): the
request_ids of orders a stockgate has begun moving, each filed under when
to look at it if nobody finishes it first (ms of Redis time). An order
command files its order here before it changes the intent record, and
takes it out once the order rests; whatever it leaves behind (it died, or
a fault outlasted the request) is found here and driven to an end by the
recovery of any stockgate. Nothing is scanned: the cost grows with the
orders in flight, never with the keyspace.

KEYS[1]  orders  <prefix>:{<shard tag>}:orders   sorted set: request_id by when to look
ARGV[1]  op
  mark <id> <after_ms>   files the order at now + after_ms, and after any
                         filing of it before (a new mark replaces an older
                         one); replies the score
  done <id> <score>      takes it out if it is still filed at <score>
                         (an attempt since has filed it again: it stays)
  later <id> <score> <after_ms>
                         files it at now + after_ms if still at <score>
  list <n>               replies {now, id, score, id, score, ...}: at most
                         n orders due by now, the earliest first
Error replies: BADCALL for anything else.
]]

--@common

local function order_due(KEYS, ARGV)
  if not call then
    bind()
  end
  local key, op = KEYS[1], ARGV[1]
  if op == 'mark' then
    -- After any filing before it, even within one millisecond: a `done` of
    -- an earlier filing must not take this one out.
    local before = to_number(call('ZSCORE', key, ARGV[2]) or '0')
    local at = now_ms() + (positive_int(ARGV[3]) or 0)
    if before + 1 > at then
      at = before + 1
    end
    call('ZADD', key, at, ARGV[2])
    return at
  end
  if op == 'done' or op == 'later' then
    local score = call('ZSCORE', key, ARGV[2])
    if not score or to_number(score) ~= to_number(ARGV[3]) then
      return 0
    end
    if op == 'done' then
      call('ZREM', key, ARGV[2])
    else
      call('ZADD', key, now_ms() + (positive_int(ARGV[4]) or 0), ARGV[2])
    end
    return 1
  end
  if op == 'list' then
    local now = now_ms()
    local listed = {now}
    local due = call('ZRANGEBYSCORE', key, '-inf', now, 'WITHSCORES', 'LIMIT', 0,
      positive_int(ARGV[2]) or 0)
    for i = 1, #due do
      listed[#listed + 1] = due[i]
    end
    return listed
  end
  return badcall('unknown op')
end

return order_due(KEYS, ARGV)
