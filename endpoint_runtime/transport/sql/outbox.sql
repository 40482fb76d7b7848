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

-- begin_and_look_up --
-- Sent as one simple query with BEGIN (saving a round trip): the command tag "SELECT 1" or
-- "SELECT 0" says whether a record exists. {{message_id}} is filled in later with an escape
-- string literal (outbox.text_literal): a constant, so the primary key serves the look-up.
SELECT 1 FROM {table} WHERE message_id = {{message_id}};

-- begin_and_claim --
-- Pessimistic, sent with BEGIN likewise: "INSERT 0 1" claims the message id; a concurrent
-- duplicate blocks here until the first commits, then gets "INSERT 0 0".
INSERT INTO {table} (message_id, dispatched, persistence_version, operations)
VALUES ({{message_id}}, false, {{version}}, NULL)
ON CONFLICT (message_id) DO NOTHING;

-- store_and_commit --
-- Optimistic: the record and COMMIT as one simple query (literals as in begin_and_look_up).
-- A concurrent duplicate fails on the primary key; the COMMIT after it is then not run.
INSERT INTO {table} (message_id, dispatched, persistence_version, operations)
VALUES ({{message_id}}, false, {{version}}, {{operations}}::jsonb);
COMMIT;

-- complete_and_commit --
-- Pessimistic: fill in the placeholder record, and COMMIT, as one simple query.
UPDATE {table} SET operations = {{operations}}::jsonb WHERE message_id = {{message_id}};
COMMIT;

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

-- dispatch_and_mark --
-- The common case in one round trip: mark the record dispatched and, only if this call did,
-- insert its operations into their one destination queue ({queue}).
WITH marked AS (
    UPDATE {table} SET dispatched = true, dispatched_at = now(), operations = NULL
    WHERE message_id = $1 AND NOT dispatched
    RETURNING 1
)
INSERT INTO {queue} (id, expires, headers, body)
SELECT m.id,
       CASE WHEN m.ttbr IS NULL THEN NULL
            ELSE (now() AT TIME ZONE 'UTC') + make_interval(secs => m.ttbr) END,
       m.headers, m.body
FROM unnest($2::uuid[], $3::float8[], $4::text[], $5::bytea[])
     WITH ORDINALITY AS m(id, ttbr, headers, body, n)
WHERE EXISTS (SELECT 1 FROM marked)
ORDER BY m.n;

-- cleanup_batch --
DELETE FROM {table}
WHERE message_id = ANY (ARRAY(
    SELECT message_id FROM {table}
    WHERE dispatched AND dispatched_at < now() - make_interval(secs => $1)
    ORDER BY dispatched_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED));
