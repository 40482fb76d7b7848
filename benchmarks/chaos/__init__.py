"""The chaos run: every message accounted for under kills, restarts and hostile input.

``python -m benchmarks.chaos`` drives one deployment per transaction mode through a backlog
and a steady send stream while a seeded schedule injects faults: handler failures (in the
messages' own fates), ``kill -9`` of receivers and of the peeker, ``pg_terminate_backend`` of
the runtime's connections, a restart of the PostgreSQL server (one the run starts itself) and
a burst of poison rows. A ledger records every send (by the sender, in the send's
transaction) and every handler's effect (by the handler, in its transaction); at the end the
checks account for every message id. See docs/reliability.md.

Modules: ``schedule`` (fates and faults, seeded, pure) · ``server`` (the run's own
PostgreSQL) · ``endpoints`` (what the receivers run) · ``ledger`` (the tables, the ledgered
sender, poison rows) · ``drivers`` (the send stream and the fault injectors) · ``checks``
(accounts, checks, recovery times) · ``report`` (per-mode runs and the JSON).
"""
