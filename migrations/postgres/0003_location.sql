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
    -- The function is pinned (below), so never inlined: PostgreSQL plans
    -- it for any SKU, with no idea how many rows one has, and a GROUP BY
    -- over the rows would sort them, on disk for a large SKU. So: one
    -- pass finds each location's anchor and newest entry, and one more
    -- per location sums from its anchor, an aggregate with no group to
    -- sort by (a SKU has few locations and may have many rows).
    -- NOT MATERIALIZED: each pass reads the table by its key, not a copy
    -- of the rows written aside.
    WITH upto AS NOT MATERIALIZED (
        SELECT j.* FROM stockgate_journal j
         WHERE j.sku = p_sku AND (j.entry_ms, j.entry_seq) <= (p_up_ms, p_up_seq)
    ), marks AS (
        -- Each location's anchor (its last baseline, else its first
        -- entry) and its newest entry, ids as [ms, seq] arrays, which
        -- compare as the ids do.
        SELECT u.location,
               bool_or(u.baseline) AS from_baseline,
               coalesce(max(ARRAY[u.entry_ms, u.entry_seq]) FILTER (WHERE u.baseline),
                        min(ARRAY[u.entry_ms, u.entry_seq])) AS anchor,
               max(ARRAY[u.entry_ms, u.entry_seq]) AS newest
          FROM upto u
         GROUP BY u.location
    )
    SELECT p_sku, m.from_baseline, m.anchor[1], m.anchor[2],
           (s.opening_stock + s.stock_change)::bigint,
           (s.opening_held + s.held_change)::bigint,
           s.entries, m.newest[1], m.newest[2], m.location
      FROM marks m,
           -- Every move of the location from its anchor on, the anchor's
           -- own included, so the opening plus its change is its
           -- stock_after.
           LATERAL (
               SELECT max(u.stock_after - u.stock_change)
                          FILTER (WHERE u.entry_ms = m.anchor[1] AND u.entry_seq = m.anchor[2])
                          AS opening_stock,
                      max(u.held_after - u.held_change)
                          FILTER (WHERE u.entry_ms = m.anchor[1] AND u.entry_seq = m.anchor[2])
                          AS opening_held,
                      sum(u.stock_change) AS stock_change,
                      sum(u.held_change) AS held_change,
                      count(*) AS entries
                 FROM upto u
                WHERE u.location = m.location
                  AND (u.entry_ms, u.entry_seq) >= (m.anchor[1], m.anchor[2])) s
     ORDER BY m.location
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
