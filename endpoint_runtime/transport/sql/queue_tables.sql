-- Whether a table may receive sends (transport.queue_tables).
-- {list_queues} is the list_queues statement of queue.sql: one definition of a queue's layout.

-- queue_table --
-- found: a relation $1.$2 exists; queue: it is a table with the queue layout.
SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = $1::text AND c.relname = $2::text) AS found,
       EXISTS (SELECT FROM ({list_queues}) AS queue WHERE queue.name = $2::text) AS queue;
