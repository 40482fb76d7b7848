"""A password in the DSN never shows: an endpoint deployed on Ray under a role with a password
(messages handled, failed, deferred), then every place a DSN could leak is searched for it:
the driver's output and log events, every file of the Ray session's logs, what Ray reports of
the deployment's actors and tasks, the text of errors that name the server, the command
line's status and queue listings, and a benchmark's JSON.

The test server may trust local connections (the embedded one does): the password is then not
checked, but it travels everywhere a DSN goes all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import ray
import structlog

from benchmarks.common import provenance, write_result
from endpoint_runtime import EndpointDeployment, Sender, TransportSettings
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.errors import EndpointRuntimeError
from endpoint_runtime.transport import quote_identifier
from tests.e2e.conftest import PEEK_DELAY, STOP_TIMEOUT, count, wait_for
from tests.support import least_privilege_endpoints
from tests.support.cli import quiet_logging, run_cli
from tests.support.least_privilege_endpoints import BILLING, BUSINESS_TABLE, PlaceOrder
from tests.support.roles import Role, login_role

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def secret_role(database_dsn: str, transport: PostgresTransport) -> AsyncIterator[Role]:
    """A role with a password that may create the endpoint's tables in the test's database
    (and databases, for the benchmark)."""
    async with login_role(database_dsn, attributes="CREATEDB") as role:
        database = quote_identifier(await transport.pool.fetchval("SELECT current_database()"))
        await transport.pool.execute(
            f"GRANT CREATE ON DATABASE {database} TO {quote_identifier(role.name)};"
            f"GRANT CREATE ON SCHEMA public TO {quote_identifier(role.name)}")
        yield role


def leaks(secret: str, places: dict[str, str]) -> list[str]:
    return [where for where, text in places.items() if secret in text]


async def deploy_and_run(role: Role) -> tuple[EndpointDeployment, str]:
    """Deploy the endpoint as ``role`` and run one message of each kind through it; returns
    the deployment (still running) and its status, shown as an operator would see it."""
    endpoint = least_privilege_endpoints.atomic
    async with PostgresTransport.connect(TransportSettings(dsn=role.dsn)) as transport:
        await transport.create_queue(BILLING)
        await transport.pool.execute(f"CREATE TABLE {BUSINESS_TABLE} (order_id text)")
        deployment = await EndpointDeployment.start(
            endpoint, stop_timeout=STOP_TIMEOUT,
            transport=TransportSettings(dsn=role.dsn, peek_delay=PEEK_DELAY))
        orders = [PlaceOrder("o1"), PlaceOrder("o2", "defer"), PlaceOrder("o3", "fail")]
        await transport.send_many(endpoint.name, [create_outgoing(o) for o in orders])

        async def settled() -> bool:
            handled = await count(transport.pool, f"SELECT count(*) FROM {BUSINESS_TABLE}")
            return handled == 2 and await transport.depth("error") == 1

        await wait_for(settled, timeout=30, what="2 orders handled and 1 in the error queue")
    status = await deployment.status(refresh=True)
    return deployment, f"{status!r}\n{status}\n{deployment.config!r}"


async def error_texts(role: Role) -> dict[str, str]:
    """Errors that name the server: a database that does not exist, a port nobody listens
    on; the whole traceback of each, as a log or a terminal would show it."""
    missing = with_database(role.dsn, "er_no_such_database")
    texts = {}
    attempts = {
        "deployment start": lambda: EndpointDeployment.start(
            least_privilege_endpoints.atomic, transport=TransportSettings(dsn=missing)),
        "transport connect": lambda: PostgresTransport.connect(TransportSettings(dsn=missing)),
        "sender": lambda: _send_with(missing),
    }
    for where, attempt in attempts.items():
        try:
            await attempt()
        except EndpointRuntimeError as exc:
            texts[where] = f"{exc!r}\n{''.join(traceback.format_exception(exc))}"
        else:
            raise AssertionError(f"{where} connected to a database that does not exist")
    return texts


async def _send_with(dsn: str) -> None:
    async with Sender("driver", TransportSettings(dsn=dsn)) as sender:
        await sender.send(PlaceOrder("never"), least_privilege_endpoints.atomic.name)


def command_line(role: Role, capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``status``, ``queues list`` and a failing command, with the DSN in the environment."""
    quiet_logging(monkeypatch)
    outputs = {}
    for argv, dsn in ((["status"], role.dsn), (["queues", "list"], role.dsn),
                      (["queues", "list"], with_database(role.dsn, "er_no_such_database"))):
        monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", dsn)
        outcome = run_cli(capsys, *argv)
        outputs[" ".join(argv) + f" (exit {outcome.code})"] = outcome.out + outcome.err
    return outputs


def ray_reports() -> dict[str, str]:
    """What Ray reports of actors, nodes and jobs, from its control store (the runtime starts
    Ray without the dashboard, so its state API is not there to ask), and every file of the
    session's logs."""
    from ray._private import state

    reports = {
        "ray actors": repr(state.actors()),
        "ray nodes": repr(ray.nodes()),
        "ray jobs": repr(state.jobs()),
    }
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    for path in sorted(logs.rglob("*")):
        if path.is_file():
            reports[f"ray log {path.name}"] = path.read_bytes().decode("utf-8", "replace")
    return reports


def benchmark_json(role: Role, tmp_path: Path) -> dict[str, str]:
    """A benchmark run (quick) on the role's DSN: its output, and its result once written."""
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.transport", "--quick", "--messages", "500",
         "--runs", "1", "--dsn", role.dsn],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "ENDPOINT_RUNTIME_LOG_LEVEL": "info"})
    assert run.returncode == 0, run.stderr[-2_000:]
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    written = write_result("secrets-test", {**result, **provenance()}, directory=tmp_path)
    return {"benchmark stdout": run.stdout, "benchmark stderr": run.stderr,
            "benchmark result file": written.read_text()}


@contextlib.contextmanager
def driver_log_events() -> Iterator[list[MutableMapping[str, Any]]]:
    """The deployment module's log events at every level, whatever an earlier test configured
    (loggers are cached with the level filter they were first used under)."""
    import endpoint_runtime.runtime.deployment as deployment_module

    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as events, pytest.MonkeyPatch.context() as patch:
            patch.setattr(deployment_module, "log",
                          structlog.get_logger("endpoint_runtime.runtime.deployment"))
            yield events
    finally:
        structlog.configure(**saved)


async def test_a_password_never_shows(
    secret_role: Role, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    secret = secret_role.password
    assert secret in secret_role.dsn
    caplog.set_level(logging.DEBUG)
    with driver_log_events() as events:
        deployment, status = await deploy_and_run(secret_role)
        try:
            places = {"deployment status and config": status, **ray_reports()}
        finally:
            await deployment.stop()
        places.update(await error_texts(secret_role))
    places["driver log events"] = repr(events)
    places["driver logging"] = caplog.text
    out, err = capfd.readouterr()
    places["driver output (Ray forwards the actors' output here)"] = out + err
    places.update(await asyncio.to_thread(command_line, secret_role, capfd, monkeypatch))
    places.update(await asyncio.to_thread(benchmark_json, secret_role, tmp_path))

    assert leaks(secret, places) == []
    # The places were searched where the DSN went: redacted, it shows.
    assert "endpoint_started" in places["driver log events"]
    assert "***" in places["deployment status and config"]
    assert "***" in places["deployment start"]
    assert any(name.startswith("ray log worker") for name in places), sorted(places)
