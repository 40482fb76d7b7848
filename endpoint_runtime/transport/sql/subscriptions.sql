-- The subscription table of publish/subscribe, laid out as NServiceBus's PostgreSQL transport
-- lays it out (its unquoted QueueAddress, Endpoint, Topic fold to these lower-case names), so
-- that .NET and Python endpoints on one database see each other's subscriptions.
-- Placeholders: {table} the quoted "schema"."table", {schema} the quoted schema.

-- create_table --
CREATE TABLE IF NOT EXISTS {table} (
    queueaddress varchar(200) NOT NULL,
    endpoint varchar(200) NOT NULL,
    topic varchar(200) NOT NULL,
    PRIMARY KEY (endpoint, topic)
);

-- subscribe --
INSERT INTO {table} (queueaddress, topic, endpoint) VALUES ($1, $2, $3)
ON CONFLICT (endpoint, topic) DO UPDATE SET queueaddress = excluded.queueaddress;

-- unsubscribe --
DELETE FROM {table} WHERE endpoint = $1 AND topic = $2;

-- subscribers --
SELECT DISTINCT queueaddress FROM {table} WHERE topic = ANY ($1::text[]) ORDER BY 1;

-- list --
SELECT topic, endpoint, queueaddress FROM {table}
WHERE ($1::text IS NULL OR endpoint = $1) ORDER BY topic, endpoint;

-- table_exists --
-- The catalog, not to_regclass: that raises (42501) for a schema the role may not use.
SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = $1::text AND c.relname = $2::text);

-- missing_queues --
-- Which of the tables ($1[i].$2[i]) do not exist. The catalog shows every role every table,
-- so a table in a schema the role may not use counts as existing: a send to it is refused
-- (42501), never taken for a missing queue.
SELECT q.schema, q.name FROM unnest($1::text[], $2::text[]) AS q(schema, name)
WHERE NOT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = q.schema AND c.relname = q.name);

-- prune --
-- Delete the rows given ($1 endpoints, $2 topics, $3 addresses) whose queue ($4.$5; NULL when
-- the address does not parse) still does not exist, checked again here: a queue made since
-- keeps its subscription. Row-level security may leave other endpoints' rows untouched.
DELETE FROM {table} AS s
USING unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
    AS d(endpoint, topic, queueaddress, schema, name)
WHERE s.endpoint = d.endpoint AND s.topic = d.topic AND s.queueaddress = d.queueaddress
  AND NOT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = d.schema AND c.relname = d.name)
RETURNING s.topic, s.endpoint, s.queueaddress;

-- unsubscribe_topics --
DELETE FROM {table} WHERE endpoint = $1 AND topic = ANY ($2::text[]) RETURNING topic;
