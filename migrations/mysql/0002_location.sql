-- Locations (docs/locations.md), as migrations/postgres/0003_location.sql
-- has them: an entry of a SKU kept by location (format 2) counts one
-- location's units, and the account is kept per (sku, location). A SKU
-- that keeps one number has the location ''. Applied one statement at a
-- time, as 0001_journal.sql explains: each statement here can run again.
--
-- The location an entry counts; '' for format 1. 64 bytes, what a
-- location's name may be (src/journal/mod.rs, MOST_LOCATION_BYTES), in
-- the binary collation like every text here. MySQL 8 has no ADD COLUMN
-- IF NOT EXISTS (MariaDB has), so each table's column is added by a
-- statement chosen by whether the column is there: adding it again
-- would fail. The key stays (sku, entry_ms, entry_seq): each location's
-- entry is its own stream entry.
SET @stockgate_location = (
    SELECT IF(COUNT(*) = 0,
              'ALTER TABLE stockgate_journal ADD COLUMN location VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT ''''',
              'SELECT 1')
      FROM information_schema.columns
     WHERE table_schema = DATABASE() AND table_name = 'stockgate_journal'
       AND column_name = 'location');
PREPARE stockgate_location FROM @stockgate_location;
EXECUTE stockgate_location;
DEALLOCATE PREPARE stockgate_location;
SET @stockgate_location = (
    SELECT IF(COUNT(*) = 0,
              'ALTER TABLE stockgate_journal_conflicts ADD COLUMN location VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT ''''',
              'SELECT 1')
      FROM information_schema.columns
     WHERE table_schema = DATABASE() AND table_name = 'stockgate_journal_conflicts'
       AND column_name = 'location');
PREPARE stockgate_location FROM @stockgate_location;
EXECUTE stockgate_location;
DEALLOCATE PREPARE stockgate_location;

-- Every (sku, location)'s account now, as PostgreSQL's view has it: each
-- location's opening (its last baseline's, or where its first entry
-- found it) plus every move of that location from there. A SKU that
-- keeps one number has one row, location ''. The location is the last
-- column, so a reader of the columns before it by position reads what it
-- read before.
CREATE OR REPLACE VIEW stockgate_account AS
WITH ranked AS (
    SELECT sku, location, entry_ms, entry_seq, baseline, stock_change, held_change,
           stock_after - stock_change AS opening_stock,
           held_after - held_change AS opening_held,
           ROW_NUMBER() OVER (PARTITION BY sku, location
               ORDER BY baseline DESC,
                        CASE WHEN baseline THEN entry_ms END DESC,
                        CASE WHEN baseline THEN entry_seq END DESC,
                        entry_ms, entry_seq) AS anchor_rank,
           ROW_NUMBER() OVER (PARTITION BY sku, location
               ORDER BY entry_ms DESC, entry_seq DESC) AS newest_rank
      FROM stockgate_journal
)
SELECT a.sku,
       a.baseline AS from_baseline,
       a.entry_ms AS opening_ms,
       a.entry_seq AS opening_seq,
       CAST(a.opening_stock + SUM(u.stock_change) AS SIGNED) AS stock,
       CAST(a.opening_held + SUM(u.held_change) AS SIGNED) AS held,
       COUNT(*) AS entries,
       n.entry_ms AS last_ms,
       n.entry_seq AS last_seq,
       a.location
  FROM ranked a
  JOIN ranked n ON n.sku = a.sku AND n.location = a.location AND n.newest_rank = 1
  JOIN ranked u ON u.sku = a.sku AND u.location = a.location
             AND (u.entry_ms > a.entry_ms OR (u.entry_ms = a.entry_ms AND u.entry_seq >= a.entry_seq))
 WHERE a.anchor_rank = 1
 GROUP BY a.sku, a.location, a.baseline, a.entry_ms, a.entry_seq, a.opening_stock, a.opening_held,
          n.entry_ms, n.entry_seq;
