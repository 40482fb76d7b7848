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

-- count --
-- $1 deployment, $2 receiver, $3 slot, $4 node, $5 processed, $6 moved to the error queue.
-- Prepared once per session and sent as EXECUTE just before the COMMIT of the work it counts.
-- Only non-key columns change: a HOT update, no index entry written.
INSERT INTO {table} AS counts (deployment_id, receiver_id, slot, node_id, processed, failed)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (deployment_id, receiver_id, slot) DO UPDATE
SET processed = counts.processed + excluded.processed,
    failed = counts.failed + excluded.failed,
    updated_at = now();

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
