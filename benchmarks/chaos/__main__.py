"""``python -m benchmarks.chaos``: the chaos run (see the package docstring and
docs/reliability.md).

Examples::

    python -m benchmarks.chaos                      # 100,000 messages per mode, five modes
    python -m benchmarks.chaos --messages 2000 --stream-seconds 20 --quick   # the CI size
    python -m benchmarks.chaos --modes atomic outbox --seed 7   # replays those two modes
    python -m benchmarks.chaos --messages 2000 --stream-seconds 20 --quick --plant-loss 3
        # the self-test: ok is false, naming the 3 deleted messages of each mode
    python -m benchmarks.chaos --messages 2000 --stream-seconds 20 --quick --pooler
        # the runtime behind a PgBouncer of the run's own, restarted twice in each mode
"""

from __future__ import annotations

import os

# The run's own Ray cluster uses token auth (tests.cluster.nodes); Ray reads the mode when it
# is imported, so it is set before anything imports Ray (the run's driver joins that cluster).
# Only when this is the program: a process that merely imports the module (the unit tests
# import `parse`) must keep its environment, or a local Ray it starts later gets a GCS server
# that wants a token from a driver that read "disabled" when Ray was imported.
if __name__ == "__main__":
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
    parser.add_argument("--seed", type=int, default=1,
                        help="each mode draws its messages, fates and fault schedule from "
                        "generators derived from the seed and its name (default 1)")
    parser.add_argument("--runtime-log-level", default="error",
                        help="log level of the peeker and receivers (default error)")
    parser.add_argument("--plant-loss", type=int, default=0, metavar="K",
                        help="self-test: delete K queued messages behind the runtime's back "
                        "(each planted mode must then fail, naming them)")
    parser.add_argument("--plant-duplicate", type=int, default=0, metavar="K",
                        help="self-test: write a second business effect for K handled "
                        "messages behind the runtime's back")
    parser.add_argument("--plant-modes", nargs="+", choices=MODES, default=None,
                        help="modes to plant in (default: every mode run)")
    parser.add_argument("--pooler", action="store_true",
                        help="the runtime's connections through a PgBouncer of the run's own "
                        "(transaction mode; the LISTEN and the run's ledger go directly), "
                        "restarted twice in each mode")
    parser.add_argument("--pool-size", type=int, default=8,
                        help="with --pooler: its server connections (default 8)")
    parser.add_argument("--quick", action="store_true",
                        help="do not write the result file (the JSON still goes to stdout)")
    args = parser.parse_args(argv)
    if args.stream_seconds is None:
        args.stream_seconds = max(20.0, args.messages / 800)
    if args.poison_per_kind is None:
        args.poison_per_kind = max(10, args.messages // 1000)
    if args.plant_modes is None:
        args.plant_modes = list(args.modes) if args.plant_loss or args.plant_duplicate else []
    if args.messages < 1 or args.nodes < 1 or not 0.0 <= args.backlog_share < 1.0:
        parser.error("--messages and --nodes must be positive, --backlog-share in [0, 1)")
    if args.plant_loss < 0 or args.plant_duplicate < 0:
        parser.error("--plant-loss and --plant-duplicate take a count of messages (K >= 0)")
    return args


if __name__ == "__main__":
    run_benchmark("chaos", parse, run_all)
