#!lua
--[[
stockgate's sweep index, one shard: files the SKUs the sweeper has just
looked at, then lists the SKUs due for a look now.

An entry's score is when the sweeper should look at its SKU (ms of Redis
time): at the latest a hold's expiry, as a HOLD's marks filed it
(lua/due_mark.lua), or the earliest expiry of the SKU's holds, as
lua/release.lua reported it. An update applies only when the SKU's mark is
the one the sweeper saw: a HOLD that marked it since may have landed after
that release looked, so its own mark's time stands (and the SKU is due
again if it was listed). A SKU with no holds left stays filed until GRACE
after its mark (a HOLD marked just before it ran may not have run yet),
then leaves the index.

KEYS[1]  due     <prefix>:{<shard tag>}:due
KEYS[2]  marks   <prefix>:{<shard tag>}:marks
ARGV[1]  how many due SKUs to list at most
ARGV[2]  GRACE, milliseconds
ARGV[3..] updates, three arguments each: sku, the mark seen (as listed
         below), next_at (lua/release.lua's; 0 when the SKU has no holds)

Replies: {now, sku, mark, sku, mark, ...}: the SKUs due by now, each with
its mark ("" when it has none).
]]

--@common

local function due_sweep(KEYS, ARGV)
  if not call then
    bind()
  end
  local due_key, marks_key = KEYS[1], KEYS[2]
  local limit, grace = to_number(ARGV[1]), to_number(ARGV[2])
  local now = now_ms()
  for i = 3, #ARGV - 2, 3 do
    local sku, seen, next_at = ARGV[i], ARGV[i + 1], to_number(ARGV[i + 2])
    local mark = call('HGET', marks_key, sku)
    if (mark or '') == seen then
      local marked = to_number(mark or '0')
      if next_at > 0 then
        call('ZADD', due_key, next_at, sku)
      elseif now - marked >= grace then
        call('ZREM', due_key, sku)
        call('HDEL', marks_key, sku)
      else
        call('ZADD', due_key, marked + grace, sku)
      end
    end
  end
  local listed = {now}
  local due = call('ZRANGEBYSCORE', due_key, '-inf', now, 'LIMIT', 0, limit)
  for i = 1, #due do
    local sku = due[i]
    listed[#listed + 1] = sku
    listed[#listed + 1] = call('HGET', marks_key, sku) or ''
  end
  return listed
end

return due_sweep(KEYS, ARGV)
