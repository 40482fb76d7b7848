"""Exceptions raised by endpoint_runtime.

Every exception the runtime raises on purpose derives from :class:`EndpointRuntimeError`::

    EndpointRuntimeError
    ├── ConfigurationError (also ValueError)      bad settings, bad registration
    │   └── InvalidQueueNameError                 a queue name that cannot be a table name
    ├── DatabaseUnavailableError                  no PostgreSQL could be reached or started
    ├── ResourcesUnavailableError                 no Ray node has the resources a deployment asks
    ├── QueueNotFoundError                        send to, or peek at, a queue that does not exist
    ├── NotAQueueError                            send to a table that is not a queue table
    ├── MessageError
    │   ├── UnknownMessageTypeError               no registered type for the enclosed type name
    │   └── MessageDecodeError                    body that does not decode; keeps raw bytes
    ├── PoisonMessageError                        headers that do not parse; keeps the raw row
    ├── TransactionAbortedError                   a handler swallowed a database error
    ├── HandlerCancelledError                     a handler cut short by a stop (NONE mode)
    ├── HandlerTimeoutError                       a handler past handler_timeout (charged)
    ├── RecoverabilityFailedError                 the retry/error-queue step itself failed
    ├── CommittedCountsFailedError                the committed-counts table cannot be written
    ├── SagaError
    │   ├── SagaConcurrencyError                  a saga instance changed under the message
    │   └── SagaStateVersionError                 stored saga state the state type cannot read
    └── HandlerControl                            raised by handlers to steer recoverability
        ├── RetryLater                            roll back, deliver again after a delay
        └── DiscardMessage                        roll back and drop the message

Configuration errors also subclass ``ValueError`` so that code validating input in the
usual Python way catches them.
"""

from __future__ import annotations

import shlex
from datetime import timedelta


class EndpointRuntimeError(Exception):
    """Root of every exception raised by endpoint_runtime on purpose."""


class ConfigurationError(EndpointRuntimeError, ValueError):
    """A setting, a handler registration or an argument is invalid."""


class ResourcesUnavailableError(EndpointRuntimeError):
    """No live node of the Ray cluster (nor a node type the autoscaler may start) has the
    custom resources a deployment's peeker or receivers ask for: they could never start."""


class InvalidQueueNameError(ConfigurationError):
    """A queue name is empty, too long for its table suffixes, or otherwise unusable."""


class DatabaseUnavailableError(EndpointRuntimeError):
    """No PostgreSQL server could be reached or started."""


class QueueNotFoundError(EndpointRuntimeError):
    """The queue table does not exist."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue} does not exist "
                         f"(create it: endpoint-runtime queues create {shlex.quote(queue)})")
        self.queue = queue


class RoutingError(EndpointRuntimeError):
    """A message was sent without a destination and no route names one for its type: a
    failure of the handler that sent it (retries, then the error queue), or of the caller."""


class HandlerReturnError(EndpointRuntimeError):
    """A handler returned something that is neither a message nor a sequence of messages: a
    failure of that handler (nothing it returned is sent)."""


class MessageError(EndpointRuntimeError):
    """A message cannot be turned into a typed object."""


class UnknownMessageTypeError(MessageError):
    """The enclosed message type names no registered msgspec Struct."""

    def __init__(self, type_names: str) -> None:
        super().__init__(f"no message type registered for {type_names!r}")
        self.type_names = type_names


class MessageDecodeError(MessageError):
    """The body does not decode into the message type; the raw bytes are kept."""

    def __init__(self, type_name: str, body: bytes, cause: Exception) -> None:
        super().__init__(f"body of {type_name} does not decode: {cause}")
        self.type_name = type_name
        self.body = body
        self.__cause__ = cause


class PoisonMessageError(EndpointRuntimeError):
    """Headers of a queue row do not parse ("probable message metadata corruption")."""


class TransactionAbortedError(EndpointRuntimeError):
    """A handler returned although its transaction was aborted by a database error it caught.

    PostgreSQL would answer the COMMIT with ROLLBACK: nothing of the message could commit. The
    runtime counts the attempt as failed (retries, then the error queue) instead.
    """

    def __init__(self) -> None:
        super().__init__(
            "the handler returned, but its database transaction was aborted by an error it "
            "caught (e.g. a UniqueViolationError): PostgreSQL would roll the COMMIT back. Catch "
            "database errors inside a savepoint: `async with context.connection.transaction(): "
            "await context.connection.execute(...)`, then the error undoes only that block"
        )


class HandlerTimeoutError(EndpointRuntimeError):
    """A handler ran past the endpoint's ``handler_timeout`` and was cancelled: a failure of
    the attempt like any other (retries, then the error queue), its transaction rolled back."""

    def __init__(self, handler: str, seconds: float) -> None:
        self.handler = handler
        self.seconds = seconds
        super().__init__(f"handler {handler} ran past handler_timeout ({seconds:g} s) and was "
                         "cancelled")


class HandlerCancelledError(EndpointRuntimeError):
    """A handler was cancelled (the receiver stopped and ``stop_timeout`` passed) after its
    message had left the queue (``TransactionMode.NONE``): its copy goes to the error queue."""

    def __init__(self) -> None:
        super().__init__(
            "the handler was cancelled before it finished (the receiver stopped and "
            "stop_timeout passed); in TransactionMode.NONE the message had already left its "
            "queue, so this copy is all that is left of it"
        )


class ConnectionLostError(EndpointRuntimeError):
    """A connection the runtime took from its pool for a message's work (a send, the check of
    a destination queue) was found closed right after asyncpg reported a client-state error on it
    (``InternalClientError: cannot switch to state ...``): the server ended the connection (a
    restart, ``pg_terminate_backend``) and asyncpg saw the server's last message before it saw
    the connection close. A failure of the transport, not of the message: where the message
    can come back it is not charged (its transaction rolls back, the receive loop backs off);
    in ``TransactionMode.NONE`` it is charged and its copy goes to the error queue."""


class CommittedCountsFailedError(EndpointRuntimeError):
    """The statement that adds to the endpoint's committed counts failed (its table dropped,
    its privileges revoked): a fault of the deployment's set-up, not of the message, which
    is never charged for it; the receive loop backs off as for a database outage."""


class RecoverabilityFailedError(EndpointRuntimeError):
    """Moving a failed message (delayed retry, error queue) failed; the message is retried."""

    def __init__(self, native_id: object) -> None:
        super().__init__(
            f"Failed to execute recoverability policy for message with native ID: `{native_id}`"
        )
        self.native_id = native_id


class SagaError(EndpointRuntimeError):
    """A saga instance could not be loaded or saved."""


class SagaConcurrencyError(SagaError):
    """Another transaction changed, completed or created the saga instance since this message
    read it (optimistic concurrency, or a lost race on the correlation index): the attempt
    fails and the message is retried, when it reads the instance afresh."""


class SagaStateVersionError(SagaError):
    """The stored state of a saga instance, written by another version of its state type
    (``SagaTypeVersion``), does not decode as the current state type."""


class NotAQueueError(EndpointRuntimeError):
    """A send or reply names a table that is not a queue table (e.g. a crafted
    ``ReplyToAddress`` naming a business table), or a schema sends may not write to."""

    def __init__(self, address: object, reason: str) -> None:
        super().__init__(f"cannot send to {address}: {reason}; sends and replies go only to "
                         "queue tables")
        self.address = address
        self.reason = reason


class HandlerControl(EndpointRuntimeError):
    """Raised by a handler to tell recoverability what to do with its message (not a fault)."""


class RetryLater(HandlerControl):
    """Raise from a handler to roll back and deliver the message again after ``delay``.

    Example::

        raise RetryLater(timedelta(minutes=5))  # the payment provider is down
    """

    def __init__(self, delay: timedelta = timedelta(seconds=10)) -> None:
        super().__init__(f"handler asked for a delayed retry in {delay}")
        self.delay = delay


class DiscardMessage(HandlerControl):
    """Raise from a handler to roll back its work and drop the message, logging ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
