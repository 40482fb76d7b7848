-- The outbox of one endpoint: table "<endpoint>_OutboxData" in the business database.
-- Placeholders: {table} quoted "schema"."table", {schema}, {dispatched_at_idx}, {dispatched_idx};
-- {queue} and {receive} are filled in per queue (outbox.OutboxStorage).

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

-- The business transaction's statements are prepared once per session (PREPARE) and sent as
-- EXECUTE with literal values, together with BEGIN or COMMIT in one simple query (outbox.py).

-- receive_and_look_up --
-- The transport's receive and, in the same round trip, whether this table records
-- the message id that the headers carry in the form this runtime writes them. The caller trusts
-- "recorded" only when looked_up_id equals the message id it parses, else it looks up itself.
WITH taken AS ({receive}),
looked_up AS (
    SELECT taken.*,
           split_part(split_part(taken.headers, '"NServiceBus.MessageId":"', 2), '"', 1)
               AS looked_up_id
    FROM taken
)
SELECT looked_up.*,
       EXISTS (SELECT 1 FROM {table} AS record WHERE record.message_id = looked_up.looked_up_id)
           AS recorded
FROM looked_up;

-- look_up --
-- Its command tag, "SELECT 1" or "SELECT 0", says whether the message id is recorded.
SELECT 1 FROM {table} WHERE message_id = $1;

-- claim --
-- Pessimistic: "INSERT 0 1" claims the message id; a concurrent duplicate blocks here until
-- the first commits, then gets "INSERT 0 0".
INSERT INTO {table} (message_id, dispatched, persistence_version, operations)
VALUES ($1, false, $2, NULL)
ON CONFLICT (message_id) DO NOTHING;

-- store --
-- Optimistic: the record, just before COMMIT; a concurrent duplicate fails on the primary key
-- (and the COMMIT after it in the same query is then not run). $4 ('true' or 'false'): the
-- handlers produced no operation, so the record is stored dispatched: nothing is left to do.
INSERT INTO {table} (message_id, dispatched, dispatched_at, persistence_version, operations)
VALUES ($1, $4::text::boolean, CASE WHEN $4::text::boolean THEN statement_timestamp() END, $2,
        CASE WHEN $4::text::boolean THEN NULL ELSE $3::jsonb END);

-- complete --
-- Pessimistic: fill in the placeholder record, just before COMMIT ($3 as $4 of store).
UPDATE {table}
SET dispatched = $3::text::boolean,
    dispatched_at = CASE WHEN $3::text::boolean THEN statement_timestamp() END,
    operations = CASE WHEN $3::text::boolean THEN NULL ELSE $2::jsonb END
WHERE message_id = $1;

-- Statements that find one record say "dispatched IS NOT TRUE", never "NOT dispatched": the
-- planner matches "NOT dispatched" to the index on dispatched, and with statistics that say
-- nearly every record is dispatched it prefers that index to the primary key. Every mark then
-- walks all undispatched entries, and the dead ones that no vacuum has removed yet (while any
-- snapshot is older, that is all of them). "IS NOT TRUE" (the same, dispatched being NOT NULL)
-- matches no index, so the record is found through its message id.

-- take_for_dispatch --
-- Marks the record dispatched and returns the operations it held, in one round trip. The row
-- lock serializes dispatchers of one message id: the second finds it dispatched, gets no row.
WITH previous AS (
    SELECT message_id, operations FROM {table}
    WHERE message_id = $1 AND dispatched IS NOT TRUE
    FOR UPDATE
)
UPDATE {table} AS record
SET dispatched = true, dispatched_at = statement_timestamp(), operations = NULL
FROM previous
WHERE record.message_id = previous.message_id
RETURNING previous.operations::text AS operations;

-- dispatch_and_mark --
-- The common case in one round trip: mark the record dispatched and, only if this call did,
-- insert its operations into their one destination queue ({queue}).
WITH marked AS (
    UPDATE {table} SET dispatched = true, dispatched_at = statement_timestamp(), operations = NULL
    WHERE message_id = $1 AND dispatched IS NOT TRUE
    RETURNING 1
)
INSERT INTO {queue} (id, expires, headers, body)
SELECT m.id,
       CASE WHEN m.ttbr IS NULL THEN NULL
            ELSE (statement_timestamp() AT TIME ZONE 'UTC') + make_interval(secs => m.ttbr) END,
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
