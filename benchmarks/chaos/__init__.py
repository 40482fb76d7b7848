"""The chaos run: every message accounted for under kills, restarts and hostile input.

``python -m benchmarks.chaos`` drives one deployment per transaction mode through a backlog
and a steady send stream while a seeded schedule injects faults: handler failures (in the
messages' own fates), ``kill -9`` of receivers and of the peeker, ``pg_terminate_backend`` of
the runtime's connections, a restart of the PostgreSQL server (one the run starts itself) and
a burst of poison rows. A ledger records every send (by the sender, in the send's
transaction), every handler's effect (by the handler, in its transaction), every discard (by
the handler, on its own connection), every expired row and, in ``none`` mode, every receive
(by triggers on the queue table); at the end every message id is placed by what was observed
of it and compared with the place its planned fate gives it. See docs/reliability.md.

Modules: ``schedule`` (fates and faults, seeded per mode, pure) · ``server`` (the run's own
PostgreSQL) · ``endpoints`` (what the receivers run) · ``observer`` (the handlers' own
connection) · ``ledger`` (the tables, the ledgered sender, poison rows; ``ledger.sql``) ·
``drivers`` (the send stream and the fault injectors) · ``plants`` (the planted faults of
the self-test) · ``observations`` (reading the ledger) · ``checks`` (accounts and checks,
pure) · ``recovery`` (recovery times, pure) · ``report`` (per-mode runs and the JSON).
"""
