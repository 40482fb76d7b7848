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

-- unsubscribe_topics --
DELETE FROM {table} WHERE endpoint = $1 AND topic = ANY ($2::text[]) RETURNING topic;
