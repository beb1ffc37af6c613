-- Locations (docs/locations.md): an entry of a SKU kept by location
-- (format 2) counts one location's units, and the account is kept per
-- (sku, location). A SKU that keeps one number has the location ''.
-- Applied in one transaction like every file here; each statement can
-- also run again.

-- The location an entry counts; '' for format 1. A column with a constant
-- default is added without rewriting the table (PostgreSQL 11 and later).
-- The key stays (sku, entry_ms, entry_seq): each location's entry is its
-- own stream entry.
ALTER TABLE stockgate_journal
    ADD COLUMN IF NOT EXISTS location text NOT NULL DEFAULT '';
ALTER TABLE stockgate_journal_conflicts
    ADD COLUMN IF NOT EXISTS location text NOT NULL DEFAULT '';

-- The function's rows gain a column, which CREATE OR REPLACE cannot do,
-- so it is dropped and made again. The view over it is never dropped (a
-- drop would take the grants an operator gave on it, and any view of
-- theirs over it, with it): for the moment between, inside this
-- transaction, it reads nothing, with its columns and the new one last.
CREATE OR REPLACE VIEW stockgate_account AS
SELECT NULL::text AS sku, NULL::boolean AS from_baseline,
       NULL::bigint AS opening_ms, NULL::bigint AS opening_seq,
       NULL::bigint AS stock, NULL::bigint AS held, NULL::bigint AS entries,
       NULL::bigint AS last_ms, NULL::bigint AS last_seq, NULL::text AS location
 WHERE false;
DROP FUNCTION IF EXISTS stockgate_account_at(text, bigint, bigint);

-- A SKU's accounts as of the entry <up_ms>-<up_seq> (all of it when
-- omitted), one row per location: each location's opening (its last
-- baseline's; a location with none opens where its first entry found
-- it) plus every move of that location from there. A SKU that keeps one
-- number has one row, location ''. The location is the last column, so
-- a reader of the columns before it by position reads what it read
-- before.
CREATE OR REPLACE FUNCTION stockgate_account_at(
    p_sku text,
    p_up_ms bigint DEFAULT 9223372036854775807,
    p_up_seq bigint DEFAULT 9223372036854775807)
RETURNS TABLE (sku text, from_baseline boolean, opening_ms bigint, opening_seq bigint,
               stock bigint, held bigint, entries bigint, last_ms bigint, last_seq bigint,
               location text)
LANGUAGE sql STABLE AS $$
    WITH upto AS (
        SELECT j.* FROM stockgate_journal j
         WHERE j.sku = p_sku AND (j.entry_ms, j.entry_seq) <= (p_up_ms, p_up_seq)
    ), anchor AS (
        SELECT DISTINCT ON (u.location)
               u.location, u.entry_ms, u.entry_seq, u.baseline,
               u.stock_after - u.stock_change AS opening_stock,
               u.held_after - u.held_change AS opening_held
          FROM upto u
         ORDER BY u.location,
                  u.baseline DESC,
                  CASE WHEN u.baseline THEN u.entry_ms END DESC NULLS LAST,
                  CASE WHEN u.baseline THEN u.entry_seq END DESC NULLS LAST,
                  u.entry_ms, u.entry_seq
    )
    SELECT p_sku, a.baseline, a.entry_ms, a.entry_seq,
           (a.opening_stock + sum(u.stock_change))::bigint,
           (a.opening_held + sum(u.held_change))::bigint,
           count(*),
           max(u.entry_ms),
           (array_agg(u.entry_seq ORDER BY u.entry_ms DESC, u.entry_seq DESC))[1],
           a.location
      FROM anchor a
      JOIN upto u ON u.location = a.location
                 AND (u.entry_ms, u.entry_seq) >= (a.entry_ms, a.entry_seq)
     GROUP BY a.location, a.baseline, a.entry_ms, a.entry_seq, a.opening_stock, a.opening_held
     ORDER BY a.location
$$;

-- Every (sku, location)'s account now: what the order service reads.
CREATE OR REPLACE VIEW stockgate_account AS
SELECT account.*
  FROM (SELECT DISTINCT sku FROM stockgate_journal) skus,
       LATERAL stockgate_account_at(skus.sku) account;

-- Pinned to the schema the function and its tables are made in, as
-- 0002_account_search_path.sql pinned the function this one replaces.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION stockgate_account_at(text, bigint, bigint) SET search_path = %I',
        current_schema());
END
$$;
