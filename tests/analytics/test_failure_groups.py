"""One failure group per cause, the same in the console, the report and ``errors groups``.

22 messages fail in a real endpoint (in process, on PostgreSQL) with "card declined for <id>",
each naming another id, and 3 with the same text but another exception type; the error queue
is ingested as the ingestion endpoint does. The console's groups, ``endpoint-runtime errors
groups`` and the Spark report then each show two groups, 22 and 3, under the same keys."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import msgspec
import pytest
from pyspark.sql import SparkSession

from endpoint_runtime import Endpoint, HandlerContext, TransportSettings
from endpoint_runtime.analytics import ReportOptions, run_report
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.console.storage import ConsoleData
from endpoint_runtime.ingestion.storage import OperationalData
from tests.analytics.databases import own_database
from tests.support.cli import run_cli
from tests.support.draining import drain


class Charge(msgspec.Struct):
    card: int
    kind: str


class CardDeclined(Exception):
    pass


class GatewayError(Exception):
    pass


def charging() -> Endpoint:
    endpoint = Endpoint("payments", immediate_retries=0, delayed_retries=0)

    @endpoint.handler
    async def charge(message: Charge, context: HandlerContext) -> None:
        error = CardDeclined if message.kind == "declined" else GatewayError
        raise error(f"card declined for {message.card}")

    return endpoint


async def fail_and_ingest(dsn: str) -> dict[str, tuple[int, str, str]]:
    """The failures, in the error queue and in error_log; the console's groups:
    ``{key: (count, exception type, title)}``."""
    async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
        for queue in ("payments", "error"):
            await transport.create_queue(queue)
        for card in range(4700, 4722):
            await transport.send("payments", create_outgoing(Charge(card, "declined")))
        for card in range(5000, 5003):
            await transport.send("payments", create_outgoing(Charge(card, "gateway")))
        await drain(transport, charging())
        assert await transport.depth("error") == 25
        console = ConsoleData(transport)
        await console.setup()  # ingestion's tables; groups() records the error queue first
        groups = await console.groups()
        async with transport.pool.acquire() as connection:
            assert await connection.fetchval("SELECT count(*) FROM error_log") == 25
            await OperationalData().setup(connection)
    return {row["key"]: (row["count"], row["label"], row["detail"]) for row in groups}


def test_twenty_two_ids_are_one_group_in_the_console_the_report_and_errors_groups(
        spark: SparkSession, server_dsn: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with own_database(server_dsn, "groups") as dsn:
        console = asyncio.run(fail_and_ingest(dsn))
        declined = f"{__name__}.CardDeclined"
        gateway = f"{__name__}.GatewayError"
        assert sorted(console.values()) == [
            (3, gateway, "card declined for <n>"), (22, declined, "card declined for <n>")]

        monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", dsn)
        listed = run_cli(capsys, "errors", "groups")
        assert listed.code == 0, listed.err
        lines = {re.split(r"\s+", line)[0]: line for line in listed.out.splitlines()[1:-1]}
        assert {key[:12] for key in console} == set(lines)
        for key, (count, exception_type, title) in console.items():
            assert re.match(rf"{key[:12]}\s+{count}\s+{re.escape(exception_type)}\s+"
                            rf"public\.payments\s+{re.escape(title)}$", lines[key[:12]])

        report = run_report(ReportOptions(dsn=dsn, out=tmp_path / "report"), spark)
        exceptions = {(e["exception_type"], e["exception_message"]): e["count"]
                      for e in report.exceptions}
        assert exceptions == {(declined, "card declined for <n>"): 22,
                              (gateway, "card declined for <n>"): 3}
        keys = {row["failure_group"] for row in
                spark.read.parquet(str(report.parquet / "exceptions")).collect()}
        assert keys == set(console)
