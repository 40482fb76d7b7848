"""The peers of the scale-out benchmark: pgqueuer and procrastinate, default and tuned.

Each side is a :class:`~benchmarks.scaleout.side.Side`: it sets up its library's tables in a
database of its own, does the sink work of every side per job, and leaves nothing behind.
``python -m benchmarks.scaleout.peers --help`` drains them without the harness, and sweeps a
library's settings (``--sweep pgqueuer``) to find its best durable configuration.

Example::

    from benchmarks.scaleout.peers import peer_sides
    from benchmarks.scaleout.side import Load

    for side in peer_sides(quick=True):
        result = await side.drain(dsn, Load(messages=2_000, concurrency=4))
"""

from __future__ import annotations

from benchmarks.scaleout.peers.base import PeerSide
from benchmarks.scaleout.peers.pgqueuer_peer import PgqueuerConfig, PgqueuerSide
from benchmarks.scaleout.peers.procrastinate_peer import ProcrastinateConfig, ProcrastinateSide
from benchmarks.scaleout.side import Side

# pgqueuer's best durable configuration at concurrency 4, from the sweep in docs/performance.md
# ("The scaling model", the peers' configurations): pgqueuer_sweep() is the grid.
PGQUEUER_BEST = PgqueuerConfig(workers=1, batch_size=50, max_concurrent_tasks=100)
# procrastinate tuned, the best of procrastinate_sweep(): four workers (four fetch loops: a
# worker fetches one job per round trip) on a pool of 12, a 0.1 s polling fallback, and
# finished jobs deleted instead of kept.
PROCRASTINATE_TUNED = ProcrastinateConfig(workers=4, pool_size=12,
                                          fetch_job_polling_interval=0.1,
                                          delete_jobs="successful")


def pgqueuer_sweep() -> list[PeerSide]:
    """The grid the best pgqueuer configuration is chosen from: batch size x workers x a cap
    on jobs in flight (x the pool driver at batch 50), every table logged as in pgqueuer's
    default durability."""
    sides: list[PeerSide] = []
    for batch_size in (10, 25, 50, 100):
        for workers in (1, 2, 4):
            for cap in (None, 2 * batch_size):
                for driver in ("connection", "pool") if batch_size == 50 else ("connection",):
                    config = PgqueuerConfig(workers=workers, batch_size=batch_size,
                                            max_concurrent_tasks=cap, driver=driver)
                    name = (f"pgqueuer_b{batch_size}_w{workers}" + (f"_cap{cap}" if cap else "")
                            + ("_pool" if driver == "pool" else ""))
                    sides.append(PgqueuerSide(name, config))
    return sides


def procrastinate_sweep() -> list[PeerSide]:
    """The grid procrastinate's tuned configuration is chosen from: workers x pool size x
    polling interval x deleting finished jobs."""
    sides: list[PeerSide] = []
    for workers in (1, 2, 4):
        for delete_jobs in (None, "successful"):
            config = ProcrastinateConfig(workers=workers, pool_size=4 + 2 * workers,
                                         fetch_job_polling_interval=0.1,
                                         delete_jobs=delete_jobs)
            name = f"procrastinate_w{workers}" + ("_delete" if delete_jobs else "")
            sides.append(ProcrastinateSide(name, config))
    return sides


def peer_sides(quick: bool) -> list[Side]:
    """pgqueuer and procrastinate, each in its default and its best/tuned configuration.

    ``quick`` changes nothing here (the harness sizes the loads); the sweeps that chose the
    tuned configurations are run by ``python -m benchmarks.scaleout.peers --sweep ...``.
    """
    del quick
    return [
        PgqueuerSide("pgqueuer_default", PgqueuerConfig()),
        PgqueuerSide("pgqueuer_best", PGQUEUER_BEST),
        ProcrastinateSide("procrastinate_default", ProcrastinateConfig()),
        ProcrastinateSide("procrastinate_tuned", PROCRASTINATE_TUNED),
    ]


__all__ = [
    "PGQUEUER_BEST",
    "PROCRASTINATE_TUNED",
    "PgqueuerConfig",
    "PgqueuerSide",
    "ProcrastinateConfig",
    "ProcrastinateSide",
    "peer_sides",
    "pgqueuer_sweep",
    "procrastinate_sweep",
]
