-- stockgate_account_at reads stockgate_journal by its bare name, which
-- PostgreSQL looks up in the search_path of whoever calls the function:
-- called from an order service's session, it could read another
-- deployment's table of the same name (--database-schema puts each
-- deployment's tables in a schema of its own). Pinned to the schema the
-- function and its tables were made in: the sink's current schema as it
-- applies this file.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION stockgate_account_at(text, bigint, bigint) SET search_path = %I',
        current_schema());
END
$$;
