"""Benchmarks of endpoint_runtime against plain asyncpg (run ``python -m benchmarks.<name>``)."""
