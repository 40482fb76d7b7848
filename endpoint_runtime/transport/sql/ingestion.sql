-- Operational data: audit copies and failed messages as typed rows, for reports (the PySpark
-- job of endpoint_runtime.analytics) and for people. Placeholders: {audit_log}, {error_log},
-- {progress}, {error_queue} (quoted "schema"."table"), and {*_idx} index names.

-- create_tables --
CREATE TABLE IF NOT EXISTS {audit_log} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id text NOT NULL,
    message_type text,
    intent text,
    sending_endpoint text,
    sending_machine text,
    processing_endpoint text,
    processing_machine text,
    conversation_id text,
    related_to text,
    time_sent timestamptz,
    processing_started timestamptz,
    processing_ended timestamptz,
    processing_time_ms double precision,
    critical_time_ms double precision,
    body_size integer NOT NULL,
    retries integer NOT NULL,
    headers text NOT NULL,
    ingested_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    ingest_xid xid8 DEFAULT pg_current_xact_id()
);
CREATE INDEX IF NOT EXISTS {audit_ended_idx} ON {audit_log} (processing_ended);
CREATE INDEX IF NOT EXISTS {audit_ingested_idx} ON {audit_log} (ingested_at);
CREATE TABLE IF NOT EXISTS {error_log} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source text NOT NULL,
    native_id uuid,
    queue_seq bigint,
    message_id text,
    message_type text,
    intent text,
    sending_endpoint text,
    processing_endpoint text,
    processing_machine text,
    failed_queue text,
    conversation_id text,
    related_to text,
    time_sent timestamptz,
    time_of_failure timestamptz,
    retries integer NOT NULL,
    exception_type text,
    exception_message text,
    body_size integer NOT NULL,
    headers text NOT NULL,
    reason text,
    ingested_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    ingest_xid xid8 DEFAULT pg_current_xact_id(),
    failure_group text,
    failure_title text
);
CREATE UNIQUE INDEX IF NOT EXISTS {error_row_idx} ON {error_log} (source, native_id, queue_seq);
CREATE INDEX IF NOT EXISTS {error_failed_idx} ON {error_log} (time_of_failure);
CREATE INDEX IF NOT EXISTS {error_ingested_idx} ON {error_log} (ingested_at);
-- The report's extracts (endpoint_runtime.analytics): each one holds every row whose
-- ingest_xid is below its horizon. Retention deletes only rows every extract holds.
CREATE TABLE IF NOT EXISTS {extracts} (
    extract text PRIMARY KEY,
    horizon xid8 NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT statement_timestamp()
);
-- last_seq: every row at or below it has been seen. The candidate is the next value of
-- last_seq, valid once the transactions that were writing to the queue when it was taken
-- (candidate_holders, virtual transaction ids) have ended.
CREATE TABLE IF NOT EXISTS {progress} (
    queue text PRIMARY KEY,
    last_seq bigint NOT NULL,
    candidate_seq bigint,
    candidate_holders text[]
);

-- progress_has_candidate --
-- Whether the progress table has the candidate columns (tables made before they existed).
SELECT count(*) = 2 FROM pg_attribute
WHERE attrelid = to_regclass($1::text) AND attname IN ('candidate_seq', 'candidate_holders')
  AND NOT attisdropped;

-- has_ingest_xid --
-- Whether audit_log and error_log have ingest_xid (tables made before it existed do not).
SELECT count(*) = 2 FROM pg_attribute
WHERE attrelid IN (to_regclass($1::text), to_regclass($2::text)) AND attname = 'ingest_xid'
  AND NOT attisdropped;

-- has_failure_group --
-- Whether error_log has the failure group columns (tables made before they existed do not).
SELECT count(*) = 2 FROM pg_attribute
WHERE attrelid = to_regclass($1::text) AND attname IN ('failure_group', 'failure_title')
  AND NOT attisdropped;

-- add_failure_group --
-- Rows written before the columns existed get their group from their own columns and headers
-- (backfill_groups, in batches, at the set-up that adds them).
ALTER TABLE {error_log} ADD COLUMN IF NOT EXISTS failure_group text,
    ADD COLUMN IF NOT EXISTS failure_title text;

-- ungrouped --
SELECT id, exception_type, exception_message, reason, headers FROM {error_log}
WHERE failure_group IS NULL AND id > $1 ORDER BY id LIMIT $2;

-- backfill_groups --
UPDATE {error_log} e SET failure_group = g.failure_group, failure_title = g.failure_title
FROM unnest($1::bigint[], $2::text[], $3::text[]) AS g (id, failure_group, failure_title)
WHERE e.id = g.id;

-- failure_group_index --
CREATE INDEX IF NOT EXISTS {error_group_idx} ON {error_log} (failure_group);

-- add_ingest_xid --
-- ingest_xid: the transaction that wrote the row, for the report's watermark (rows of every
-- transaction older than the oldest one still running have committed or never will). Rows
-- written before the column existed keep NULL: older than any horizon.
ALTER TABLE {audit_log} ADD COLUMN IF NOT EXISTS ingest_xid xid8;
ALTER TABLE {audit_log} ALTER COLUMN ingest_xid SET DEFAULT pg_current_xact_id();
ALTER TABLE {error_log} ADD COLUMN IF NOT EXISTS ingest_xid xid8;
ALTER TABLE {error_log} ALTER COLUMN ingest_xid SET DEFAULT pg_current_xact_id();

-- ingest_xid_indexes --
CREATE INDEX IF NOT EXISTS {audit_xid_idx} ON {audit_log} (ingest_xid);
CREATE INDEX IF NOT EXISTS {error_xid_idx} ON {error_log} (ingest_xid);

-- add_candidate --
ALTER TABLE {progress} ADD COLUMN IF NOT EXISTS candidate_seq bigint,
    ADD COLUMN IF NOT EXISTS candidate_holders text[];

-- insert_audit --
INSERT INTO {audit_log} (message_id, message_type, intent, sending_endpoint, sending_machine,
    processing_endpoint, processing_machine, conversation_id, related_to, time_sent,
    processing_started, processing_ended, processing_time_ms, critical_time_ms, body_size,
    retries, headers)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
    $7::text[], $8::text[], $9::text[], $10::timestamptz[], $11::timestamptz[],
    $12::timestamptz[], $13::float8[], $14::float8[], $15::int[], $16::int[], $17::text[]);

-- insert_errors --
-- A failed message is recorded once per row of its queue (native id and seq): a scan that
-- sees it again adds nothing.
INSERT INTO {error_log} (source, native_id, queue_seq, message_id, message_type, intent,
    sending_endpoint, processing_endpoint, processing_machine, failed_queue, conversation_id,
    related_to, time_sent, time_of_failure, retries, exception_type, exception_message,
    body_size, headers, reason, failure_group, failure_title)
SELECT * FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::text[], $5::text[], $6::text[],
    $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],
    $13::timestamptz[], $14::timestamptz[], $15::int[], $16::text[], $17::text[], $18::int[],
    $19::text[], $20::text[], $21::text[], $22::text[])
ON CONFLICT (source, native_id, queue_seq) DO NOTHING;

-- add_progress --
INSERT INTO {progress} (queue, last_seq) VALUES ($1, 0) ON CONFLICT (queue) DO NOTHING;

-- lock_progress --
-- One ingesting process at a time scans the error queue: the others skip it.
SELECT last_seq, candidate_seq, candidate_holders FROM {progress}
WHERE queue = $1 FOR UPDATE SKIP LOCKED;

-- holders_alive --
-- Whether any of these transactions (virtual ids) is still running: each holds a lock on its
-- own virtual id for as long as it runs.
SELECT EXISTS (SELECT FROM pg_locks
               WHERE locktype = 'virtualxid' AND virtualxid = ANY ($1::text[]));

-- scan_error_queue --
-- The rows stay (errors retry still finds them). $1 is last_seq: every row at or below it
-- has been seen; above it, the rows not recorded yet, in seq order.
SELECT q.id, q.seq, q.headers, octet_length(q.body) AS body_size FROM {error_queue} q
WHERE q.seq > $1
  AND NOT EXISTS (SELECT FROM {error_log} l
                  WHERE l.source = $3 AND l.native_id = q.id AND l.queue_seq = q.seq)
ORDER BY q.seq LIMIT $2;

-- take_candidate --
-- The highest seq this statement's snapshot sees, and then the transactions that hold the
-- queue's ROW EXCLUSIVE lock. A row below that seq that the snapshot did not see was written
-- by a transaction running at the snapshot: it took the lock before it drew its seq and keeps
-- it to its end, so it is among the holders (or ended before they were read, and is visible
-- to every later scan). Once every holder has ended, a scan from last_seq sees all rows up to
-- the candidate. $1: the queue's quoted name.
SELECT (SELECT max(seq) FROM {error_queue}) AS seq,
       ARRAY(SELECT DISTINCT virtualtransaction FROM pg_locks
             WHERE locktype = 'relation' AND relation = to_regclass($1::text)
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND mode = 'RowExclusiveLock'
               AND pid IS DISTINCT FROM pg_backend_pid()) AS holders;

-- set_progress --
UPDATE {progress} SET last_seq = greatest(last_seq, $2), candidate_seq = $3,
    candidate_holders = $4
WHERE queue = $1;

-- clean_audit_log --
-- One batch of at most $2 rows older than $1 seconds; run again until a batch comes back short
-- (each batch its own short transaction). When the report keeps extracts, only rows every
-- extract already holds (below the lowest horizon; NULL: written before ingest_xid existed).
DELETE FROM {audit_log} WHERE id = ANY (ARRAY(
    SELECT id FROM {audit_log}
    WHERE ingested_at < statement_timestamp() - make_interval(secs => $1)
      AND (ingest_xid IS NULL OR NOT EXISTS (SELECT FROM {extracts})
           OR ingest_xid < (SELECT min(horizon) FROM {extracts}))
    LIMIT $2));

-- clean_error_log --
DELETE FROM {error_log} WHERE id = ANY (ARRAY(
    SELECT id FROM {error_log}
    WHERE ingested_at < statement_timestamp() - make_interval(secs => $1)
      AND (ingest_xid IS NULL OR NOT EXISTS (SELECT FROM {extracts})
           OR ingest_xid < (SELECT min(horizon) FROM {extracts}))
    LIMIT $2));

-- endpoint_activity --
-- Per processing endpoint, from the audit copies of the last $1 seconds: messages per second
-- and critical time percentiles.
SELECT processing_endpoint AS endpoint,
       count(*) / $1::float8 AS per_second,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY critical_time_ms) AS critical_p50_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY critical_time_ms) AS critical_p95_ms
FROM {audit_log}
WHERE processing_ended > statement_timestamp() - make_interval(secs => $1)
  AND processing_endpoint IS NOT NULL
GROUP BY 1;

-- failed_by_queue --
-- Messages waiting in the error queue, by the queue they failed in (read from the header text:
-- rows whose headers do not parse count under NULL).
SELECT substring(headers FROM '"NServiceBus\.FailedQ"\s*:\s*"((?:[^"\\]|\\.)*)"') AS queue,
       count(*) AS failed
FROM {error_queue} GROUP BY 1;
