"""Deploy endpoints on a Ray cluster, run them, and say what each node did.

The script that ``ray submit``, ``ray job submit`` and a plain ``python`` on a machine of the
cluster all run (see docs/cluster.md)::

    ray submit ray_cluster.yaml endpoint_runtime/submit.py -- \\
        handlers_examples.sales:endpoint --nodes 3 --duration 600
    python -m endpoint_runtime.submit handlers_examples.sales:endpoint --until-empty
    python -m endpoint_runtime.submit --config cluster.toml   # its [submit] table

It connects to ``RAY_ADDRESS`` (else starts a local Ray), waits until ``--nodes`` nodes are
alive, checks that some node has the resources the deployments ask for, prepares every
endpoint (``--install``: creates its queues, tables and business schema) and subscribes it
before any starts, deploys each against the configured PostgreSQL (``ENDPOINT_RUNTIME_DSN``,
``--config``), logs a status line per endpoint every ``--status-interval`` seconds (with the
last known figures when a peeker does not answer), and runs until SIGINT/SIGTERM,
``--duration`` seconds, or (``--until-empty``) every queue and delayed store is empty with
nothing in flight. A peeker lost with its node is recreated on a surviving node. At the end it
prints, per node, the receivers that ran there and the messages they processed, and a last
line ``submit_result {json}`` for scripts. Exit status 0; 1 when a deployment could not be
placed or kept running or halted on a critical error; 2 on a configuration error.

This file stays one small script: ``ray submit`` copies it alone to the head and runs it
there; the rest comes from the package installed on the head
(:mod:`endpoint_runtime.submission`).
"""

from __future__ import annotations

import sys

from endpoint_runtime.submission.driver import main
from endpoint_runtime.submission.options import build_parser
from endpoint_runtime.submission.report import NodeReport

__all__ = ["NodeReport", "build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
