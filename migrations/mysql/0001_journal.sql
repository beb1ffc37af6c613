-- stockgate's books in MySQL 8 and MariaDB 10.11: the tables of
-- migrations/postgres/0001_journal.sql, the same columns and keys, in
-- MySQL's SQL. `stockgate journal sink` applies this file at start, one
-- statement at a time (each ends with a semicolon at the end of its
-- line), holding GET_LOCK('stockgate/<database>/migrate') so sinks starting
-- together apply it once, and records it in stockgate_migrations. MySQL
-- commits each CREATE by itself, so every statement here is one that can
-- run again: a sink that died half way through applies the rest next time.
--
-- Text is utf8mb4 with a binary collation: a SKU, a request_id and an
-- order_no compare byte for byte, as Redis keeps them (a default
-- collation would take "SKU-1" and "sku-1" for one key).

-- One row per journal entry, keyed by its identity in Redis: the SKU and
-- its stream id <entry_ms>-<entry_seq>. A re-delivered entry meets the key
-- and changes nothing.
CREATE TABLE IF NOT EXISTS stockgate_journal (
    sku          VARCHAR(128) NOT NULL,
    entry_ms     BIGINT       NOT NULL,
    entry_seq    BIGINT       NOT NULL,
    format       INT          NOT NULL,
    event        VARCHAR(16)  NOT NULL,
    request_id   VARCHAR(255) NOT NULL,
    order_no     VARCHAR(255) NOT NULL,
    stock_change BIGINT       NOT NULL,
    held_change  BIGINT       NOT NULL,
    stock_after  BIGINT       NOT NULL,
    held_after   BIGINT       NOT NULL,
    baseline     BOOLEAN      GENERATED ALWAYS AS (event = 'set') STORED,
    sunk_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (sku, entry_ms, entry_seq),
    KEY stockgate_journal_baselines (sku, baseline, entry_ms, entry_seq),
    KEY stockgate_journal_order_no (order_no),
    CONSTRAINT stockgate_journal_event CHECK (event IN
        ('deduct', 'revert', 'hold', 'confirm', 'cancel', 'expire', 'set', 'add'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- An entry whose id is already in stockgate_journal with other content
-- (a failover without --wait-replicas lost the entry that had it first).
CREATE TABLE IF NOT EXISTS stockgate_journal_conflicts (
    sku          VARCHAR(128) NOT NULL,
    entry_ms     BIGINT       NOT NULL,
    entry_seq    BIGINT       NOT NULL,
    format       INT          NOT NULL,
    event        VARCHAR(16)  NOT NULL,
    request_id   VARCHAR(255) NOT NULL,
    order_no     VARCHAR(255) NOT NULL,
    stock_change BIGINT       NOT NULL,
    held_change  BIGINT       NOT NULL,
    stock_after  BIGINT       NOT NULL,
    held_after   BIGINT       NOT NULL,
    seen_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (sku, entry_ms, entry_seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Every SKU's account now, as PostgreSQL's view has it: its opening (the
-- last baseline's, or where its first entry found it) plus every move
-- from there. What the order service reads.
CREATE OR REPLACE VIEW stockgate_account AS
WITH ranked AS (
    SELECT sku, entry_ms, entry_seq, baseline, stock_change, held_change,
           stock_after - stock_change AS opening_stock,
           held_after - held_change AS opening_held,
           ROW_NUMBER() OVER (PARTITION BY sku
               ORDER BY baseline DESC,
                        CASE WHEN baseline THEN entry_ms END DESC,
                        CASE WHEN baseline THEN entry_seq END DESC,
                        entry_ms, entry_seq) AS anchor_rank,
           ROW_NUMBER() OVER (PARTITION BY sku
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
       n.entry_seq AS last_seq
  FROM ranked a
  JOIN ranked n ON n.sku = a.sku AND n.newest_rank = 1
  JOIN ranked u ON u.sku = a.sku
             AND (u.entry_ms > a.entry_ms OR (u.entry_ms = a.entry_ms AND u.entry_seq >= a.entry_seq))
 WHERE a.anchor_rank = 1
 GROUP BY a.sku, a.baseline, a.entry_ms, a.entry_seq, a.opening_stock, a.opening_held,
          n.entry_ms, n.entry_seq;
