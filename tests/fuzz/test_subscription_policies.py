"""The row-level security of the subscription table (``subscription_policies``) for any
endpoint name: applied on a real PostgreSQL with ``standard_conforming_strings`` off, the role
may write the rows of exactly that endpoint name and of no other; a name never escapes its
literal; NUL is refused clearly."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.privileges import own_policy_name, subscription_policies
from endpoint_runtime.transport import QueueAddress, quote_identifier
from tests.fuzz.conftest import examples, outcome
from tests.fuzz.test_names import injected, names, nonconforming
from tests.support.roles import Role, login_role

TABLE = QueueAddress("SubscriptionRouting")
_ = nonconforming  # the fixture, imported for this module's tests


@pytest.fixture
async def subscriber_role(nonconforming: PostgresTransport, database_dsn: str
                          ) -> AsyncIterator[Role]:
    await nonconforming.pool.execute(
        f"CREATE TABLE {TABLE.qualified} (queueaddress varchar(200) NOT NULL, endpoint "
        "varchar(200) NOT NULL, topic varchar(200) NOT NULL, PRIMARY KEY (endpoint, topic))")
    async with login_role(database_dsn) as role:
        await nonconforming.pool.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE.qualified} "
            f"TO {quote_identifier(role.name)}")
        yield role


@examples(0.3)
@given(endpoint=st.one_of(names, st.text(max_size=199)))
async def test_a_role_writes_the_rows_of_exactly_its_endpoint_name(
    nonconforming: PostgresTransport, subscriber_role: Role, endpoint: str,
) -> None:
    statements = outcome(lambda: subscription_policies(TABLE, subscriber_role.name, endpoint))
    if isinstance(statements, ValueError):
        assert "\x00" in endpoint
        return
    assert isinstance(statements, list)
    insert = (f"INSERT INTO {TABLE.qualified} (queueaddress, endpoint, topic) "
              "VALUES ('q', $1, 't')")
    async with nonconforming.pool.acquire() as connection:
        try:
            for statement in statements:
                await connection.execute(statement)
            async with connection.transaction():
                await connection.execute(f"SET LOCAL ROLE {quote_identifier(subscriber_role.name)}")
                await connection.execute(insert, endpoint)
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    async with connection.transaction():
                        await connection.execute(insert, endpoint + "x")
            assert await connection.fetchval(
                f"SELECT endpoint FROM {TABLE.qualified}") == endpoint
        finally:
            await connection.execute(f"DELETE FROM {TABLE.qualified}")
            await connection.execute(
                f"DROP POLICY IF EXISTS "
                f"{quote_identifier(own_policy_name(subscriber_role.name, endpoint))} "
                f"ON {TABLE.qualified}")
    assert not await injected(nonconforming)
