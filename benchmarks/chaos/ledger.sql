-- The chaos run's ledger: one block per statement (loaded by benchmarks.chaos.ledger).
-- {queue} is a queue table's quoted, schema-qualified name; {trigger} a quoted trigger name.

-- schema --
-- chaos_sent: every id the run put into a queue (written in the send's transaction).
-- chaos_effects: one row per committed handler execution (the handler's business write).
-- chaos_observed: what handlers noted on a connection of their own (a discard).
-- chaos_expired: rows of a queue deleted already expired (a trigger on the queue table).
-- chaos_received: none mode only: every committed receive, with the client's port and the
--   backend's pid, so that a message lost by design can be traced to a fault (behind the
--   run's pooler the client's port is the one its application_name ends with).
CREATE TABLE IF NOT EXISTS chaos_sent (
    message_id uuid PRIMARY KEY, mode text NOT NULL, kind text NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS chaos_effects (
    message_id uuid NOT NULL, attempt int NOT NULL, mode text NOT NULL, pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS chaos_effects_by_id ON chaos_effects (message_id);
CREATE TABLE IF NOT EXISTS chaos_observed (
    message_id uuid NOT NULL, mode text NOT NULL, event text NOT NULL, pid int NOT NULL,
    started timestamptz NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS chaos_expired (
    message_id uuid NOT NULL, queue text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS chaos_received (
    message_id uuid NOT NULL, queue text NOT NULL, backend int NOT NULL, client_port int,
    application text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION chaos_note_expired() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_expired (message_id, queue) VALUES (OLD.id, TG_TABLE_NAME);
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION chaos_note_received() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_received (message_id, queue, backend, client_port, application)
    VALUES (OLD.id, TG_TABLE_NAME, pg_backend_pid(), inet_client_port(),
            current_setting('application_name'));
    RETURN NULL;
END $$;

-- watch_expiry --
-- The same test as the receive's RETURNING (one statement, one statement_timestamp()).
CREATE TRIGGER {trigger} AFTER DELETE ON {queue} FOR EACH ROW
WHEN (OLD.expires IS NOT NULL AND OLD.expires < (statement_timestamp() AT TIME ZONE 'UTC'))
EXECUTE FUNCTION chaos_note_expired();

-- watch_receives --
CREATE TRIGGER {trigger} AFTER DELETE ON {queue} FOR EACH ROW
EXECUTE FUNCTION chaos_note_received();

-- record_sent --
INSERT INTO chaos_sent (message_id, mode, kind)
SELECT id, $2, kind FROM unnest($1::uuid[], $3::text[]) AS sent(id, kind);

-- is_recorded --
SELECT count(*) FROM chaos_sent WHERE message_id = $1;

-- plant_loss --
-- Behind the runtime's back: delete up to $2 queued messages of fate "ok" that no receiver
-- holds (the newest, furthest from the receivers), and say which.
DELETE FROM {queue}
WHERE seq IN (SELECT q.seq FROM {queue} AS q JOIN chaos_sent AS s ON s.message_id = q.id
              WHERE s.mode = $1 AND s.kind = 'ok'
              ORDER BY q.seq DESC LIMIT $2 FOR UPDATE OF q SKIP LOCKED)
RETURNING id;

-- plant_duplicate --
-- Behind the runtime's back: a second business effect for up to $2 handled messages of
-- fate "ok" (pid 0 marks the planted row).
INSERT INTO chaos_effects (message_id, attempt, mode, pid)
SELECT e.message_id, 0, $1, 0 FROM chaos_effects AS e
WHERE e.mode = $1 AND e.message_id IN (SELECT message_id FROM chaos_sent
                                       WHERE mode = $1 AND kind = 'ok')
GROUP BY e.message_id HAVING count(*) = 1
ORDER BY min(e.at) LIMIT $2
RETURNING message_id;

-- sent --
SELECT message_id, kind FROM chaos_sent WHERE mode = $1;

-- effects --
SELECT message_id, extract(epoch FROM at)::float8 AS at FROM chaos_effects
WHERE mode = $1 ORDER BY at;

-- discards --
SELECT DISTINCT message_id FROM chaos_observed WHERE mode = $1 AND event = 'discard';

-- expired --
SELECT message_id FROM chaos_expired WHERE queue = $1;

-- received --
-- Receives only: not the deletes of the run's own connections (a planted loss).
SELECT message_id, backend, client_port, application, extract(epoch FROM at)::float8 AS at
FROM chaos_received WHERE queue = $1 AND application <> ALL($2::text[]);

-- runtime_backends --
-- The backends of the runtime (not the run's own connections) in this database.
SELECT coalesce(array_agg(pid), ARRAY[]::int[]) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_type = 'client backend' AND application_name <> ALL($1::text[]);

-- backend_applications --
-- The application_name of each backend of $1 (behind the run's pooler it ends with the port of
-- the client whose transaction the backend runs, or ran last).
SELECT coalesce(array_agg(application_name), ARRAY[]::text[]) FROM pg_stat_activity
WHERE pid = ANY($1::int[]);

-- terminate_backends --
-- The pids of $1 whose termination was signalled.
SELECT coalesce(array_agg(pid), ARRAY[]::int[]) FROM unnest($1::int[]) AS chosen(pid)
WHERE pg_terminate_backend(pid);

-- error_rows --
SELECT id, headers FROM {queue};

-- echoes --
SELECT convert_from(body, 'UTF8')::json->>'origin' AS origin, count(*) AS n
FROM {queue} GROUP BY 1;

-- queued_ids --
SELECT id FROM {queue};

-- count_rows --
SELECT count(*) FROM {queue};
