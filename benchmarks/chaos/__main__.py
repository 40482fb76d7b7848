"""``python -m benchmarks.chaos``: the chaos run (see the package docstring and
docs/reliability.md).

Examples::

    python -m benchmarks.chaos                      # 100,000 messages per mode, five modes
    python -m benchmarks.chaos --messages 2000 --stream-seconds 20 --quick   # the CI size
    python -m benchmarks.chaos --modes atomic outbox --seed 7
"""

from __future__ import annotations

import os

# The run's own Ray cluster uses token auth (tests.cluster.nodes); Ray reads the mode when it
# is imported, so it is set before anything imports Ray (the run's driver joins that cluster).
os.environ["RAY_AUTH_MODE"] = "token"

import argparse

from benchmarks.chaos.endpoints import MODES
from benchmarks.chaos.report import run_all
from benchmarks.common import run_benchmark


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000,
                        help="messages per mode (default 100000)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--backlog-share", type=float, default=0.5,
                        help="share of the messages sent before the stream (default 0.5)")
    parser.add_argument("--stream-seconds", type=float, default=None,
                        help="seconds over which the rest is sent, while faults are injected "
                        "(default: messages / 800, at least 20)")
    parser.add_argument("--kill-interval", type=float, default=4.0,
                        help="seconds between receiver kills (default 4)")
    parser.add_argument("--poison-per-kind", type=int, default=None,
                        help="poison rows of each kind in the burst (default messages / 1000, "
                        "at least 10)")
    parser.add_argument("--nodes", type=int, default=3, help="Ray nodes (default 3)")
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="seconds to wait for everything to settle after the stream")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--runtime-log-level", default="error",
                        help="log level of the peeker and receivers (default error)")
    parser.add_argument("--quick", action="store_true",
                        help="do not write the result file (the JSON still goes to stdout)")
    args = parser.parse_args(argv)
    if args.stream_seconds is None:
        args.stream_seconds = max(20.0, args.messages / 800)
    if args.poison_per_kind is None:
        args.poison_per_kind = max(10, args.messages // 1000)
    if args.messages < 1 or args.nodes < 1 or not 0.0 <= args.backlog_share < 1.0:
        parser.error("--messages and --nodes must be positive, --backlog-share in [0, 1)")
    return args


if __name__ == "__main__":
    run_benchmark("chaos", parse, run_all)
