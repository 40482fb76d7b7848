-- The server's connections, for the connection budget (endpoint_runtime.connections.connection_budget).

-- server_capacity --
-- What the server has left for new client connections, the asking one not counted. To a role
-- without pg_read_all_stats, other roles' sessions show no backend_type: one with a database
-- counts as a client. A session whose application_name is a deployment's reservation
-- ('endpoint_runtime/<deployment id>/<connections>/<endpoint>') counts in its deployment's
-- claim instead: the larger of its reservation and the sessions it has open.
WITH sessions AS (
    SELECT substring(application_name FROM '^endpoint_runtime/([0-9a-f]{8})/') AS deployment,
           substring(application_name
                     FROM '^endpoint_runtime/[0-9a-f]{8}/([0-9]{1,9})/')::int AS reserves
      FROM pg_stat_activity
     WHERE pid <> pg_backend_pid()
       AND (backend_type = 'client backend' OR (backend_type IS NULL AND datid IS NOT NULL))
), deployments AS (
    SELECT deployment, greatest(max(reserves), count(*)) AS claim
      FROM sessions
     WHERE deployment IS NOT NULL
     GROUP BY deployment
)
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS superuser_reserved,
       coalesce(current_setting('reserved_connections', true), '0')::int AS reserved,
       (SELECT count(*) FROM sessions WHERE deployment IS NULL)::int AS in_use,
       (SELECT coalesce(sum(claim), 0) FROM deployments)::int AS claimed,
       (SELECT count(*) FROM deployments)::int AS deployments;
