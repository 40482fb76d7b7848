"""Ray actors of one endpoint deployment.

- ``peeker``: one per deployment; peeks the queue, scales receivers, hands out wake-ups.
- ``receiver``: 0..max_receivers; pulls messages from PostgreSQL itself and runs the pipeline.
- ``scaling``: the pure policy the peeker follows (testable without Ray).
- ``cluster``: connecting to Ray (``RAY_ADDRESS``) or starting a local one.

Ray carries control only (start, allowance, wake, drain, status); messages travel over asyncpg.
"""
