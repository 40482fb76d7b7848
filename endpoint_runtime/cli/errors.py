"""``endpoint-runtime errors list|groups|show|retry|delete``: the messages of the error queue.

Built on :mod:`endpoint_runtime.chain.recoverability.error_queue`. Messages are named by their
native id (the queue
row's ``id``, as ``errors list`` shows it). A retry moves the message back to its
``NServiceBus.FailedQ`` in one transaction; when that fails (no such message, no FailedQ, the
FailedQ's table is gone, headers that do not parse) the message stays where it is.

Example::

    endpoint-runtime errors list --limit 20
    endpoint-runtime errors groups                # one line per cause, as the console groups
    endpoint-runtime errors list --group 5d41402a   # the messages of one group (key prefix)
    endpoint-runtime errors show 3f1c0e9a-...
    endpoint-runtime errors retry 3f1c0e9a-...
    endpoint-runtime errors retry --all
    endpoint-runtime errors delete 3f1c0e9a-...
"""

from __future__ import annotations

import argparse
import sys
import uuid

from endpoint_runtime.chain.recoverability.error_queue import (
    FailedMessage,
    delete_failed,
    list_failed,
    retry_all,
    retry_failed,
    show_failed,
)
from endpoint_runtime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    existing_queue,
    positive_int,
)
from endpoint_runtime.cli.common import printable as _printable
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import ConfigurationError, EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.wire.messages import PoisonMessage, from_wire_time

DEFAULT_ERROR_QUEUE = "error"
GROUP_PAGE = 1_000
"""Error-queue rows read per query by ``groups`` and ``list --group``."""
GROUP_KEY_SHOWN = 12
"""Hex digits of a group's key shown (``list --group`` takes any prefix)."""
MESSAGE_COLUMN_WIDTH = 80
HEX_BYTES_PER_LINE = 16


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    errors = commands.add_parser(
        "errors", parents=[common], help="list, show, retry, delete failed messages",
        description="The messages of the error queue, named by their native id.",
    )
    queue = argparse.ArgumentParser(add_help=False)
    queue.add_argument("--queue", default=DEFAULT_ERROR_QUEUE, metavar="QUEUE",
                       help=f"the error queue ([schema.]name, default {DEFAULT_ERROR_QUEUE})")
    parents = [common, queue]
    error_commands = errors.add_subparsers(dest="errors_command", required=True,
                                           metavar="COMMAND")

    listing = error_commands.add_parser("list", parents=parents,
                                        help="failed messages, oldest first")
    listing.add_argument("--limit", type=positive_int, default=100, metavar="N",
                         help="show at most N messages (default 100)")
    listing.add_argument("--group", metavar="KEY", default=None,
                         help="only the messages of this failure group (its key, or the start "
                              "of it, as `errors groups` shows it)")
    listing.set_defaults(handler=errors_list)

    groups = error_commands.add_parser(
        "groups", parents=parents, help="failed messages grouped by cause, largest first",
        description="One line per failure group: exception type, message with ids masked and "
                    "innermost stack frames (the console's and the report's groups).")
    groups.set_defaults(handler=errors_groups)

    show = error_commands.add_parser("show", parents=parents,
                                     help="headers and body of one failed message")
    show.add_argument("id", metavar="ID", help="native id, as `errors list` shows it")
    show.set_defaults(handler=errors_show)

    retry = error_commands.add_parser(
        "retry", parents=parents, help="move failed messages back to their FailedQ",
        description="Move one message (ID) or every message (--all) back to the queue it "
        "failed in. With --all, messages that cannot be retried stay in the error queue and "
        "the exit status is 1.",
    )
    which = retry.add_mutually_exclusive_group(required=True)
    which.add_argument("id", metavar="ID", nargs="?", help="native id, as `errors list` shows it")
    which.add_argument("--all", action="store_true", help="every message that can be retried")
    retry.set_defaults(handler=errors_retry)

    delete = error_commands.add_parser("delete", parents=parents,
                                       help="delete one failed message for good")
    delete.add_argument("id", metavar="ID", help="native id, as `errors list` shows it")
    delete.set_defaults(handler=errors_delete)


async def errors_list(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        address = await existing_queue(transport, args.queue)
        if args.group:
            grouped = [m for m in await every_failed(transport, args.queue)
                       if m.group.key.startswith(args.group)]
            failed, total = grouped[:args.limit], len(grouped)
        else:
            failed = await list_failed(transport, args.queue, limit=args.limit)
            total = await transport.depth(address)
    if not failed:
        print(f"no failed messages in {address}"
              + (f" in group {_printable(args.group, keep='')}" if args.group else ""))
        return EXIT_OK
    rows = [("native id", "failed queue", "exception type", "time of failure", "message")]
    rows.extend(_summary(message) for message in failed)
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    # The total is counted after the page was read, so it can only be an approximation.
    if total > len(failed):
        print(f"({len(failed)} shown of {total} in {address}; --limit N shows more)")
    return EXIT_OK


async def every_failed(transport: PostgresTransport, error_queue: str) -> list[FailedMessage]:
    """Every message of the error queue, oldest first, read a page at a time."""
    found: list[FailedMessage] = []
    while page := await list_failed(transport, error_queue, limit=GROUP_PAGE,
                                    offset=len(found)):
        found.extend(page)
        if len(page) < GROUP_PAGE:
            break
    return found


async def errors_groups(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        address = await existing_queue(transport, args.queue)
        failed = await every_failed(transport, args.queue)
    if not failed:
        print(f"no failed messages in {address}")
        return EXIT_OK
    groups: dict[str, list[FailedMessage]] = {}
    for message in failed:
        groups.setdefault(message.group.key, []).append(message)
    rows = [("group", "count", "exception type", "failed queues", "message (ids masked)")]
    for key, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        first = members[0]
        exception = ("(poison message)" if isinstance(first.message, PoisonMessage)
                     else first.exception_type or "-")
        queues = sorted({m.failed_queue or "-" for m in members})
        rows.append((key[:GROUP_KEY_SHOWN], str(len(members)), _printable(exception, keep=""),
                     _printable(",".join(queues), keep=""), _first_line(first.group.title)))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    print(f"({len(failed)} messages in {len(groups)} groups; `errors list --group KEY` lists "
          "a group's messages)")
    return EXIT_OK


def _summary(failed: FailedMessage) -> tuple[str, str, str, str, str]:
    if isinstance(failed.message, PoisonMessage):
        return (str(failed.native_id), "-", "(poison message)", "-",
                _first_line(f"headers do not parse: {failed.message.reason}"))
    return (
        str(failed.native_id),
        _printable(failed.failed_queue or "-", keep=""),
        _printable(failed.exception_type or "-", keep=""),
        _readable_time(failed.time_of_failure),
        _first_line(failed.exception_message or ""),
    )


def _first_line(text: str) -> str:
    line = _printable(text.strip().split("\n", 1)[0].rstrip(), keep="")
    if len(line) > MESSAGE_COLUMN_WIDTH:
        return line[: MESSAGE_COLUMN_WIDTH - 3] + "..."
    return line


def _readable_time(wire: str | None) -> str:
    if not wire:
        return "-"
    try:
        return from_wire_time(wire).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return _printable(wire, keep="")  # written by something else: show it as it is


async def errors_show(args: argparse.Namespace, settings: TransportSettings) -> int:
    native_id = parse_native_id(args.id)
    async with PostgresTransport.connect(settings) as transport:
        address = await existing_queue(transport, args.queue)
        failed = await show_failed(transport, native_id, args.queue)
    if failed is None:
        raise EndpointRuntimeError(f"no message {native_id} in {address}")
    message = failed.message
    print(f"native id: {failed.native_id}")
    print(f"queue: {address}")
    if message.expires is not None:
        print(f"expires: {message.expires.isoformat(' ')} UTC")
    if isinstance(message, PoisonMessage):
        print(f"poison message: {_printable(message.reason, keep='')}")
        print("raw headers (they do not parse):")
        print(_indented(_printable(message.raw_headers)))
    else:
        print(f"headers ({len(message.headers)}):")
        for name in sorted(message.headers):
            print(_indented(_printable(f"{name}: {message.headers[name]}")))
    print(_body(message.body))
    return EXIT_OK


def _indented(text: str) -> str:
    """Indent by two spaces; continuation lines (stack traces) by four."""
    first, *rest = text.split("\n")
    return "\n".join([f"  {first}", *(f"    {line}" for line in rest)])


def _body(body: bytes) -> str:
    size = f"{len(body)} byte{'' if len(body) == 1 else 's'}"
    if not body:
        return f"body ({size})"
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        lines = [
            f"{offset:08x}  {body[offset:offset + HEX_BYTES_PER_LINE].hex(' ')}"
            for offset in range(0, len(body), HEX_BYTES_PER_LINE)
        ]
        return "\n".join([f"body ({size}, not UTF-8; hex):", *lines])
    return f"body ({size}, UTF-8):\n{_printable(text)}"


async def errors_retry(args: argparse.Namespace, settings: TransportSettings) -> int:
    native_id = None if args.all else parse_native_id(args.id)
    async with PostgresTransport.connect(settings) as transport:
        address = await existing_queue(transport, args.queue)
        if native_id is None:
            result = await retry_all(transport, args.queue)
        else:
            try:
                queue = await retry_failed(transport, native_id, args.queue)
            except QueueNotFoundError as exc:
                raise EndpointRuntimeError(
                    f"cannot retry message {native_id}: its FailedQ {exc.queue} does not exist "
                    f"(create it, or delete the message); it stays in {address}"
                ) from exc
            print(f"moved message {native_id} from {address} back to {queue}")
            return EXIT_OK
    skipped = result.skipped
    if not result.moved and not skipped:
        print(f"no failed messages in {address}")
    for queue, moved in sorted(result.moved.items()):
        print(f"moved {moved} message(s) from {address} back to {queue}")
    if skipped:
        print(
            f"{PROG}: {skipped} message(s) could not be retried and stay in {address} "
            "(no FailedQ, FailedQ missing, its native id already in the FailedQ, or headers "
            "that do not parse; "
            "`errors retry ID` says why)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


async def errors_delete(args: argparse.Namespace, settings: TransportSettings) -> int:
    native_id = parse_native_id(args.id)
    async with PostgresTransport.connect(settings) as transport:
        address = await existing_queue(transport, args.queue)
        if not await delete_failed(transport, native_id, args.queue):
            raise EndpointRuntimeError(f"no message {native_id} in {address}")
    print(f"deleted message {native_id} from {address}")
    return EXIT_OK


def parse_native_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise ConfigurationError(
            f"{text!r} is not a native id (a UUID, as `errors list` shows it)"
        ) from None
