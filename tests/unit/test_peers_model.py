"""The pure parts of the peers' sides and of the scaling model (no database, no Ray)."""

from __future__ import annotations

import msgspec
import pytest

from benchmarks.scaleout.costs import Cluster, MessageCosts, cpu_spent, project
from benchmarks.scaleout.peers import peer_sides
from benchmarks.scaleout.peers.pgqueuer_peer import PgqueuerConfig
from benchmarks.scaleout.peers.procrastinate_peer import ProcrastinateConfig
from benchmarks.scaleout.peers.sink import SinkJob, chunks, random_body, summarize_latency
from benchmarks.scaleout.side import Load


def costs(**changes: float | None) -> MessageCosts:
    figures = {"mode": "single", "msgs_per_s": 4_000.0, "concurrency": 4,
               "runtime_cpu_us": 200.0, "postgres_cpu_us": 100.0, "wal_bytes": 1_000.0,
               "commits": 1.0, "wal_flushes": 0.5, "connections_per_receiver": 9.0}
    return MessageCosts(**{**figures, **changes})  # type: ignore[arg-type]


def test_worker_cpu_binds_a_small_cluster_and_grows_with_nodes() -> None:
    one = project(costs(), Cluster(nodes=1, node_cores=2, server_cores=32))
    two = project(costs(), Cluster(nodes=2, node_cores=2, server_cores=32))
    assert one[1] == two[1] == "worker CPU"
    assert one[0] == pytest.approx(10_000.0)
    assert two[0] == pytest.approx(20_000.0)


def test_postgres_cpu_binds_many_nodes_on_a_small_server() -> None:
    rate, limit = project(costs(), Cluster(nodes=32, node_cores=2, server_cores=4,
                                           max_connections=10_000))
    assert limit == "PostgreSQL CPU"
    assert rate == pytest.approx(40_000.0)


def test_connections_cap_the_slots() -> None:
    # 100 connections / 9 per receiver of 4 slots = 44.4 slots, at 1,000 msg/s each.
    rate, limit = project(costs(postgres_cpu_us=1.0, runtime_cpu_us=1.0, wal_bytes=1.0),
                          Cluster(nodes=64, node_cores=2, server_cores=64,
                                  flushes_per_s=1e9))
    assert limit == "connections"
    assert rate == pytest.approx(100 / 9 * 4 * 1_000.0)


def test_wal_bytes_and_flushes_bind_when_cpu_is_plentiful() -> None:
    plenty = {"postgres_cpu_us": 1.0, "runtime_cpu_us": 1.0}
    assert project(costs(**plenty, wal_bytes=2**20),
                   Cluster(nodes=8, node_cores=2, server_cores=64)) == (200.0, "WAL bytes")
    rate, limit = project(costs(**plenty, wal_bytes=1.0),
                          Cluster(nodes=1, node_cores=2, server_cores=64, flushes_per_s=100))
    assert limit == "WAL flushes"
    assert rate == pytest.approx(1_600.0)  # 16 slots x 100 flushes a second


def test_batched_commits_lift_the_flush_limit() -> None:
    cluster = Cluster(nodes=1, node_cores=2, server_cores=64, flushes_per_s=100)
    plenty = {"postgres_cpu_us": 1.0, "runtime_cpu_us": 1.0, "wal_bytes": 1.0}
    single = project(costs(**plenty), cluster)[0]
    batched = project(costs(**plenty, commits=1 / 50), cluster)[0]
    assert batched >= single * 10


def test_without_a_local_server_postgres_cpu_is_no_limit() -> None:
    _, limit = project(costs(postgres_cpu_us=None),
                       Cluster(nodes=1, node_cores=2, server_cores=1))
    assert limit == "worker CPU"


def test_cpu_spent_counts_new_processes_whole() -> None:
    assert cpu_spent({1: 2.0, 2: 1.0}, {1: 3.5, 2: 1.0, 3: 0.25}) == pytest.approx(1.75)


def test_sink_job_round_trips_and_bodies_are_ascii_of_the_asked_size() -> None:
    body = random_body(1000)
    assert len(body) == 1000
    assert body.decode("ascii")
    job = SinkJob(7, 1.5, body)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(job), type=SinkJob) == job


def test_chunks_bound_jobs_and_bytes_and_keep_every_job() -> None:
    jobs = [SinkJob(key, 0.0, b"x" * 1000) for key in range(25)]
    parts = chunks(jobs, max_bytes=10_000, max_jobs=8)
    assert [len(part) for part in parts] == [8, 8, 8, 1]
    parts = chunks(jobs, max_bytes=5_000, max_jobs=100)
    assert all(len(part) == 5 for part in parts)
    assert [job.key for part in parts for job in part] == list(range(25))


def test_latency_summary() -> None:
    assert summarize_latency([]) == {}
    summary = summarize_latency([float(v) for v in range(1, 101)])
    assert summary == {"p50": 50.5, "p95": pytest.approx(95.05), "p99": pytest.approx(99.01)}


def test_configurations_refuse_what_the_libraries_refuse() -> None:
    with pytest.raises(ValueError, match="2 x batch_size"):
        PgqueuerConfig(batch_size=50, max_concurrent_tasks=60)
    with pytest.raises(ValueError, match="driver"):
        PgqueuerConfig(driver="psycopg")


def test_procrastinate_defaults_stay_procrastinates() -> None:
    options = ProcrastinateConfig().worker_options(Load(messages=10, concurrency=4))
    assert options == {"queues": ["scaleout"], "concurrency": 4,
                       "install_signal_handlers": False, "wait": True}


def test_peer_sides_name_each_library_default_and_tuned() -> None:
    names = [side.name for side in peer_sides(quick=True)]
    assert names == ["pgqueuer_default", "pgqueuer_best", "procrastinate_default",
                     "procrastinate_tuned"]
    assert all(side.config["library"] in ("pgqueuer", "procrastinate")
               for side in peer_sides(quick=False))
