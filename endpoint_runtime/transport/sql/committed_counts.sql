-- The committed counts of one endpoint: table "<endpoint>_CommittedCounts" beside its queue.
-- One row per receive slot of a receiver of a deployment (transactions.counting): a slot's
-- row is written only by that slot, in the transaction that commits the messages it counts,
-- so no two transactions wait for each other's row.
-- Placeholders: {table} quoted "schema"."table", {schema} quoted schema.

-- create_schema --
CREATE SCHEMA IF NOT EXISTS {schema};

-- create_table --
CREATE TABLE IF NOT EXISTS {table} (
    deployment_id text NOT NULL,
    receiver_id text NOT NULL,
    slot integer NOT NULL,
    node_id text NOT NULL,
    processed bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (deployment_id, receiver_id, slot)
);

-- ensure_row --
-- $1 deployment, $2 receiver, $3 slot, $4 node: the slot's row, made (or marked alive) before
-- its first count; the counts themselves are plain UPDATEs, cheaper than an upsert (no check
-- for a conflict, no tuple lock of its own in the WAL) on a path taken by every message.
INSERT INTO {table} AS counts (deployment_id, receiver_id, slot, node_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (deployment_id, receiver_id, slot) DO UPDATE SET updated_at = now();

-- count --
-- $1 deployment, $2 receiver, $3 slot, $4 processed, $5 moved to the error queue.
-- Prepared once per session and sent as EXECUTE just before the COMMIT of the work it counts.
-- Only non-key columns change: a HOT update, no index entry written.
UPDATE {table}
SET processed = processed + $4, failed = failed + $5, updated_at = now()
WHERE deployment_id = $1 AND receiver_id = $2 AND slot = $3;

-- read --
-- The committed counts of the deployments $1, per Ray node.
SELECT node_id, sum(processed)::bigint AS processed, sum(failed)::bigint AS failed
FROM {table} WHERE deployment_id = ANY ($1::text[])
GROUP BY node_id;

-- clean_up --
-- Rows of deployments that have committed nothing for $1 seconds.
DELETE FROM {table} WHERE deployment_id IN (
    SELECT deployment_id FROM {table} GROUP BY deployment_id
    HAVING max(updated_at) < now() - make_interval(secs => $1)
);
