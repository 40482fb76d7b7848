-- The built-in delayed-message store: one table per endpoint, "<endpoint>.delayed".
-- Placeholders as in queue.sql: {table} quoted "schema"."table", {schema}, {due_idx}, {notify},
-- {channel} and {table_literal} (quoted literals).

-- create_table --
-- The key is (id, destination): one message may be deferred to several queues.
CREATE TABLE IF NOT EXISTS {table} (
    id uuid NOT NULL,
    destination text NOT NULL,
    due timestamptz NOT NULL,
    headers text NOT NULL,
    body bytea,
    failures integer NOT NULL DEFAULT 0,
    PRIMARY KEY (id, destination)
);

-- migrate_key --
-- Tables made before the key became (id, destination) had the key (id): widen it once.
DO $migrate$
DECLARE
    key_name name;
BEGIN
    SELECT conname INTO key_name FROM pg_constraint
    WHERE conrelid = {table_literal}::regclass AND contype = 'p' AND cardinality(conkey) = 1;
    IF key_name IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I, ADD PRIMARY KEY (id, destination)',
                       {table_literal}, key_name);
    END IF;
END
$migrate$;

-- create_due_index --
CREATE INDEX IF NOT EXISTS {due_idx} ON {table} (due);

-- create_notify_trigger --
CREATE OR REPLACE TRIGGER {notify} AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.endpoint_runtime_notify({channel});

-- store --
-- A second deferral of one message id to one queue is kept too: it waits under a fresh row id
-- (the message id travels in its headers). Nothing deferred is ever dropped.
WITH kept AS (
    INSERT INTO {table} (id, destination, due, headers, body) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (id, destination) DO NOTHING
    RETURNING id
)
INSERT INTO {table} (id, destination, due, headers, body)
SELECT gen_random_uuid(), $2, $3, $4, $5 WHERE NOT EXISTS (SELECT FROM kept);

-- fetch_next_due --
-- Locks the row: a competing mover skips it, so one instance dispatches it.
SELECT id, destination, due, headers, body, failures FROM {table}
WHERE due <= statement_timestamp()
ORDER BY due
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- remove --
DELETE FROM {table} WHERE id = $1 AND destination = $2;

-- increment_failure_count --
-- The failed message is also postponed (1, 2, 4 ... up to 60 s), so that the messages due
-- after it go first and it cannot hold up the rest of the store.
UPDATE {table}
SET failures = failures + 1,
    due = greatest(due, statement_timestamp()) + make_interval(secs => least(60, 2 ^ failures))
WHERE id = $1 AND destination = $2;

-- next_due --
-- Seconds from the database's own now() to the earliest due time (negative: overdue).
SELECT extract(epoch FROM (min(due) - now()))::float8 FROM {table};
