"""Passwords never show: redacted DSNs (URL and keyword forms, quoted values) and the reprs
of everything that carries a DSN to Ray actors (issue 13, item 12)."""

from __future__ import annotations

import pickle

import pytest

from endpoint_runtime.connections.embedded import RedactedDsn, redact_dsn
from endpoint_runtime.runtime.actors.deployment_status import DeploymentConfig
from endpoint_runtime.runtime.actors.receiver import ReceiverConfig
from endpoint_runtime.settings import EndpointSettings, TransportSettings
from endpoint_runtime.transport import QueueAddress

SECRET = "Top Secret"

REDACTED = [
    ("postgresql://app:s3cret@db:5432/x", "postgresql://app:***@db:5432/x"),
    ("postgresql://app:p%40ss%20Secret@db/x", "postgresql://app:***@db/x"),
    ("postgresql://app:Top Secret@db/x", "postgresql://app:***@db/x"),
    ("postgresql://db/x?user=app&password=Top Secret&sslmode=require",
     "postgresql://db/x?user=app&password=***&sslmode=require"),
    ("postgresql://db/x?PassWord=Top%20Secret", "postgresql://db/x?PassWord=***"),
    ("host=db password='Top Secret' dbname=x", "host=db password=*** dbname=x"),
    ("host=db password = 'Top Secret' dbname=x", "host=db password = *** dbname=x"),
    ("host=db password='it\\'s Top Secret' dbname=x", "host=db password=*** dbname=x"),
    ("host=db password='Top \\\\ Secret' dbname=x", "host=db password=*** dbname=x"),
    ("host=db password=s3cret dbname=x", "host=db password=*** dbname=x"),
    ("host=db PASSWORD='Top Secret", "host=db PASSWORD=***"),
    ("host=db sslpassword='Top Secret' dbname=x", "host=db sslpassword=*** dbname=x"),
    ("host=db dbname='my db' user=app", "host=db dbname='my db' user=app"),
]


@pytest.mark.parametrize(("dsn", "expected"), REDACTED)
def test_redact_dsn_hides_the_whole_password(dsn: str, expected: str) -> None:
    assert redact_dsn(dsn) == expected
    for word in ("Top", "Secret", "s3cret", "it\\'s"):
        if word not in expected:
            assert word not in redact_dsn(dsn)


def test_configs_that_travel_to_ray_actors_never_show_the_password() -> None:
    dsn = RedactedDsn("host=db user=app password='Top Secret' dbname=x")
    assert str(dsn) == "host=db user=app password='Top Secret' dbname=x"  # what connects
    settings = EndpointSettings(transport=TransportSettings(dsn=dsn))
    deployment = DeploymentConfig(endpoint_path="m:e", endpoint_name="e",
                                  address=QueueAddress("e"), dsn=dsn, settings=settings,
                                  deployment_id="1")
    receiver = ReceiverConfig(endpoint_path="m:e", dsn=deployment.dsn, settings=settings,
                              receiver_id="e-1")
    for config in (deployment, receiver, settings, settings.transport, dsn):
        shown = repr(config)
        assert "Secret" not in shown, shown
        assert "***" in shown, shown
        # Ray pickles actor arguments: the copy an actor gets hides its password too.
        copy = pickle.loads(pickle.dumps(config))
        assert "Secret" not in repr(copy)
    assert isinstance(pickle.loads(pickle.dumps(receiver)).dsn, RedactedDsn)
