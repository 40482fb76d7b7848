"""The outbox: its records in PostgreSQL (``storage``) and its step of the chain (``step``):
deduplication, the business transaction, the dispatch."""
