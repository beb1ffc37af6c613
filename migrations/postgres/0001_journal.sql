-- stockgate's books in PostgreSQL (issue 26): every journal entry the sink
-- moved out of Redis, once. `stockgate journal sink` applies this file at
-- start, inside a transaction holding an advisory lock, and records it in
-- stockgate_migrations, so any number of sinks starting at once apply it
-- exactly once. src/journal/mod.rs owns what each column means.

-- One row per journal entry. The key is the entry's identity in Redis:
-- the SKU and its stream id <entry_ms>-<entry_seq> (entry_ms is the
-- primary's Redis time when it appended the entry). A re-delivered entry
-- (a sink killed after its commit and before its trim) meets the key and
-- changes nothing.
CREATE TABLE IF NOT EXISTS stockgate_journal (
    sku          text        NOT NULL,
    entry_ms     bigint      NOT NULL,
    entry_seq    bigint      NOT NULL,
    format       integer     NOT NULL,
    event        text        NOT NULL CHECK (event IN
                   ('deduct', 'revert', 'hold', 'confirm', 'cancel', 'expire', 'set', 'add')),
    request_id   text        NOT NULL,  -- an order's line: ~ord:<order id>; STOCK.SET/ADD: the op_id
    order_no     text        NOT NULL,  -- '' when the request carried none
    stock_change bigint      NOT NULL,  -- signed change of the available stock
    held_change  bigint      NOT NULL,  -- signed change of the units on hold
    stock_after  bigint      NOT NULL,
    held_after   bigint      NOT NULL,
    -- Where the SKU's account starts again: STOCK.SET (`stock import`
    -- writes stock directly and journals nothing). stock_after of the last
    -- baseline is the account's opening; the moves after it add up from
    -- there.
    baseline     boolean     GENERATED ALWAYS AS (event = 'set') STORED,
    sunk_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, entry_ms, entry_seq)
);

CREATE INDEX IF NOT EXISTS stockgate_journal_baselines
    ON stockgate_journal (sku, entry_ms DESC, entry_seq DESC) WHERE baseline;
-- "Which units did order X take?" reads by order_no.
CREATE INDEX IF NOT EXISTS stockgate_journal_order_no
    ON stockgate_journal (order_no) WHERE order_no <> '';

-- An entry whose id is already in stockgate_journal with other content.
-- Redis can give an id twice only when a failover lost the entry that had
-- it (a primary died before its replica had the entry, without
-- --wait-replicas): then both changes happened in Redis's history, and the
-- books must say so instead of dropping one. The sink counts each in
-- stockgate_journal_conflicts_total and logs it; an operator decides.
CREATE TABLE IF NOT EXISTS stockgate_journal_conflicts (
    sku          text        NOT NULL,
    entry_ms     bigint      NOT NULL,
    entry_seq    bigint      NOT NULL,
    format       integer     NOT NULL,
    event        text        NOT NULL,
    request_id   text        NOT NULL,
    order_no     text        NOT NULL,
    stock_change bigint      NOT NULL,
    held_change  bigint      NOT NULL,
    stock_after  bigint      NOT NULL,
    held_after   bigint      NOT NULL,
    seen_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, entry_ms, entry_seq)
);

-- A SKU's account as of the entry <up_ms>-<up_seq> (all of it when
-- omitted): its opening (the last baseline's; a SKU with no baseline
-- opens where its first entry found it) plus every move from there.
-- Written so that the opening plus the anchor's own change is the
-- anchor's stock_after, whatever the anchor is. `stockgate reconcile`
-- asks it as of the last id Redis had given when it read the SKU.
CREATE OR REPLACE FUNCTION stockgate_account_at(
    p_sku text,
    p_up_ms bigint DEFAULT 9223372036854775807,
    p_up_seq bigint DEFAULT 9223372036854775807)
RETURNS TABLE (sku text, from_baseline boolean, opening_ms bigint, opening_seq bigint,
               stock bigint, held bigint, entries bigint, last_ms bigint, last_seq bigint)
LANGUAGE sql STABLE AS $$
    WITH upto AS (
        SELECT j.* FROM stockgate_journal j
         WHERE j.sku = p_sku AND (j.entry_ms, j.entry_seq) <= (p_up_ms, p_up_seq)
    ), anchor AS (
        SELECT u.entry_ms, u.entry_seq, u.baseline,
               u.stock_after - u.stock_change AS opening_stock,
               u.held_after - u.held_change AS opening_held
          FROM upto u
         ORDER BY u.baseline DESC,
                  CASE WHEN u.baseline THEN u.entry_ms END DESC NULLS LAST,
                  CASE WHEN u.baseline THEN u.entry_seq END DESC NULLS LAST,
                  u.entry_ms, u.entry_seq
         LIMIT 1
    )
    SELECT p_sku, a.baseline, a.entry_ms, a.entry_seq,
           (a.opening_stock + sum(u.stock_change))::bigint,
           (a.opening_held + sum(u.held_change))::bigint,
           count(*),
           max(u.entry_ms),
           (array_agg(u.entry_seq ORDER BY u.entry_ms DESC, u.entry_seq DESC))[1]
      FROM anchor a
      JOIN upto u ON (u.entry_ms, u.entry_seq) >= (a.entry_ms, a.entry_seq)
     GROUP BY a.baseline, a.entry_ms, a.entry_seq, a.opening_stock, a.opening_held
$$;

-- Every SKU's account now: what the order service reads.
CREATE OR REPLACE VIEW stockgate_account AS
SELECT account.*
  FROM (SELECT DISTINCT sku FROM stockgate_journal) skus,
       LATERAL stockgate_account_at(skus.sku) account;
