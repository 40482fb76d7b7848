-- The built-in delayed-message store: one table per endpoint, "<endpoint>.delayed".
-- Placeholders as in queue.sql: {table} quoted "schema"."table", {schema}, {due_idx}, {notify},
-- {channel} (a quoted literal).

-- create_table --
CREATE TABLE IF NOT EXISTS {table} (
    id uuid NOT NULL PRIMARY KEY,
    destination text NOT NULL,
    due timestamptz NOT NULL,
    headers text NOT NULL,
    body bytea,
    failures integer NOT NULL DEFAULT 0
);

-- create_due_index --
CREATE INDEX IF NOT EXISTS {due_idx} ON {table} (due);

-- create_notify_trigger --
CREATE OR REPLACE TRIGGER {notify} AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.endpoint_runtime_notify({channel});

-- store --
INSERT INTO {table} (id, destination, due, headers, body) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO NOTHING;

-- fetch_next_due --
-- Locks the row: a competing mover skips it, so one instance dispatches it.
SELECT id, destination, due, headers, body, failures FROM {table}
WHERE due <= now()
ORDER BY due
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- remove --
DELETE FROM {table} WHERE id = $1;

-- increment_failure_count --
UPDATE {table} SET failures = failures + 1 WHERE id = $1;

-- next_due --
-- Seconds from the database's own now() to the earliest due time (negative: overdue).
SELECT extract(epoch FROM (min(due) - now()))::float8 FROM {table};
