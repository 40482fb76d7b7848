-- The outbox of one endpoint: table "<endpoint>_OutboxData" in the business database.
-- Placeholders: {table} quoted "schema"."table", {schema}, {dispatched_at_idx}, {dispatched_idx}.

-- create_table --
CREATE TABLE IF NOT EXISTS {table} (
    message_id text NOT NULL PRIMARY KEY,
    dispatched boolean NOT NULL DEFAULT false,
    dispatched_at timestamptz,
    persistence_version text NOT NULL,
    operations jsonb
);

-- create_dispatched_at_index --
CREATE INDEX IF NOT EXISTS {dispatched_at_idx} ON {table} (dispatched_at);

-- create_dispatched_index --
CREATE INDEX IF NOT EXISTS {dispatched_idx} ON {table} (dispatched);

-- exists --
SELECT dispatched FROM {table} WHERE message_id = $1;

-- store --
-- Optimistic: a concurrent duplicate fails here on the primary key.
INSERT INTO {table} (message_id, dispatched, persistence_version, operations)
VALUES ($1, false, $2, $3::jsonb);

-- begin_pessimistic --
-- Pessimistic: a concurrent duplicate blocks here until the first commits, then inserts nothing.
INSERT INTO {table} (message_id, dispatched, persistence_version, operations)
VALUES ($1, false, $2, NULL)
ON CONFLICT (message_id) DO NOTHING;

-- complete_pessimistic --
UPDATE {table} SET operations = $2::jsonb WHERE message_id = $1;

-- take_for_dispatch --
-- Marks the record dispatched and returns the operations it held, in one round trip. The row
-- lock serializes dispatchers of one message id: the second finds it dispatched, gets no row.
WITH previous AS (
    SELECT message_id, operations FROM {table}
    WHERE message_id = $1 AND NOT dispatched
    FOR UPDATE
)
UPDATE {table} AS record
SET dispatched = true, dispatched_at = now(), operations = NULL
FROM previous
WHERE record.message_id = previous.message_id
RETURNING previous.operations::text AS operations;

-- cleanup_batch --
DELETE FROM {table}
WHERE message_id = ANY (ARRAY(
    SELECT message_id FROM {table}
    WHERE dispatched AND dispatched_at < now() - make_interval(secs => $1)
    ORDER BY dispatched_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED));
