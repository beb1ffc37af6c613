#!lua
--[[
stockgate stock import, plain (src/bulk.rs): one slot's rows of SKUs that
keep one number, each SKU's stock set to its row's qty, in the order given,
as the SETs an import sent before did (no op record, no journal entry:
docs/operations.md), but never over a SKU kept by location
(docs/locations.md): the stock key of such a SKU holds its kind, and a
number written there would hand its records and holds by location to a
one number. Its row is refused, and none of its keys change.

KEYS     the rows' stock keys, <prefix>:{<sku>}, in the file's order (one
         slot: a cluster runs a script on one)
ARGV     their qtys, one a key: decimal integers from 0 to 2^53 - 1, as
         stockgate checked them

Reply: {position, reason, ...}: each refused row's position in KEYS
(1-based) and why; empty when every row was written.
Error replies (nothing changed): BADCALL when the keys or the qtys are not
what stockgate sends.
]]

--@common

local function import_stock(KEYS, ARGV)
  if not call then
    bind()
  end
  if #KEYS ~= #ARGV then
    return badcall('one qty a key')
  end
  for i = 1, #KEYS do
    local key, qty = KEYS[i], ARGV[i]
    if sub(key, -1) ~= '}' or not find(key, '{', 1, true) then
      return badcall('keys do not follow the stockgate key layout')
    end
    local n = qty == '0' and 0 or positive_int(qty)
    if not n or n > EXACT then
      return badcall('stock must be an integer from 0 to 2^53 - 1')
    end
  end
  local refused = {}
  for i = 1, #KEYS do
    if call('GET', KEYS[i]) == LOCATED then
      refused[#refused + 1] = i
      refused[#refused + 1] = NAME_LOCATION
    else
      call('SET', KEYS[i], ARGV[i])
    end
  end
  return refused
end

return import_stock(KEYS, ARGV)
