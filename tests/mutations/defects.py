"""The planted defects: each breaks one guarantee of docs/guarantees.md, by exact replacement.

Each defect's ``catchers`` are the tests that docs/guarantees.md (or, for sagas, which it does
not list, docs/sagas.md's "Tests") names for the guarantee it breaks, cheapest first:
``--tests targeted`` runs them with ``-x``, so the first that fails ends the run. An old text
that is no longer in its file exactly once fails the whole mutation run (exit status 2):
update the edit here when the code it breaks moves.
"""

from __future__ import annotations

from tests.mutations.core import Defect, Edit

ERROR_QUEUE_COPY_LOST = Defect(
    name="error-queue-copy-lost",
    summary="a message whose retries are used up is removed without a trace: the move to the "
            "error queue consumes it but never writes the error-queue copy",
    edits=(Edit(
        "endpoint_runtime/chain/recoverability/error_queue.py",
        "    await sending.send_failed(executor, error_queue, message.native_id, copy.headers,"
        " copy.body)\n",
        "    del executor, error_queue, copy  # MUTATION: the error-queue copy is never written\n",
    ),),
    catchers=(
        "tests/integration/test_recoverability_failure.py"
        "::test_none_mode_sends_failures_to_the_error_queue_even_when_asked_to_retry",
        "tests/integration/test_aborted_transactions.py"
        "::test_a_swallowed_database_error_is_a_failed_attempt_and_ends_in_the_error_queue",
        "tests/e2e/test_recoverability.py"
        "::test_unrecoverable_exception_goes_straight_to_the_error_queue",
    ),
)

OUTBOX_DUPLICATE_PROCESSED = Defect(
    name="outbox-duplicate-processed",
    summary="outbox deduplication skipped: a message whose id the outbox has recorded runs its "
            "handlers again",
    edits=(Edit(
        "endpoint_runtime/chain/outbox/step.py",
        "            if duplicate:  # recorded by an earlier delivery\n",
        "            if False:  # MUTATION: a recorded message id is processed again\n",
    ),),
    catchers=(
        "tests/integration/test_outbox.py::test_the_same_message_twice_in_a_row_runs_handlers_once",
        "tests/integration/test_outbox.py::test_a_message_id_with_quotes_goes_through_the_outbox",
        "tests/integration/test_publish_subscribe.py"
        "::test_the_outbox_publishes_once_however_often_the_message_comes",
        "tests/e2e/test_outbox_deployed.py"
        "::test_duplicates_across_two_deployments_take_effect_once",
    ),
)

SKIP_LOCKED_DROPPED = Defect(
    name="skip-locked-dropped",
    summary="SKIP LOCKED dropped from every receive statement of queue.sql (receive, "
            "receive_past, receive_batch): a receive waits on the rows in-flight receives hold",
    edits=(
        Edit(  # receive (the plain one, the benchmarks' baseline)
            "endpoint_runtime/transport/sql/queue.sql",
            "WHERE seq = (SELECT seq FROM {queue} ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED)\n",
            "WHERE seq = (SELECT seq FROM {queue} ORDER BY seq LIMIT 1 FOR UPDATE)\n",
        ),
        Edit(  # receive_past (the runtime's receive; the outbox's receive is built on it)
            "endpoint_runtime/transport/sql/queue.sql",
            "        (SELECT seq FROM {queue} WHERE seq > $1::bigint ORDER BY seq LIMIT 1\n"
            "         FOR UPDATE SKIP LOCKED)\n"
            "    END,\n"
            "    (SELECT seq FROM {queue} ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED))\n",
            "        (SELECT seq FROM {queue} WHERE seq > $1::bigint ORDER BY seq LIMIT 1\n"
            "         FOR UPDATE)\n"
            "    END,\n"
            "    (SELECT seq FROM {queue} ORDER BY seq LIMIT 1 FOR UPDATE))\n",
        ),
        Edit(  # receive_batch
            "endpoint_runtime/transport/sql/queue.sql",
            "            nullif(ARRAY(SELECT seq FROM {queue} WHERE seq > $2::bigint ORDER BY seq"
            " LIMIT $1\n"
            "                         FOR UPDATE SKIP LOCKED), '{{}}')\n"
            "        END,\n"
            "        ARRAY(SELECT seq FROM {queue} ORDER BY seq LIMIT $1"
            " FOR UPDATE SKIP LOCKED)))\n",
            "            nullif(ARRAY(SELECT seq FROM {queue} WHERE seq > $2::bigint ORDER BY seq"
            " LIMIT $1\n"
            "                         FOR UPDATE), '{{}}')\n"
            "        END,\n"
            "        ARRAY(SELECT seq FROM {queue} ORDER BY seq LIMIT $1 FOR UPDATE)))\n",
        ),
    ),
    catchers=(
        # Written for this defect. Of the tests below, the first passes with it (its receives
        # wait on each other's rows, briefly); the second waits on its own held row until
        # pytest-timeout (300 s), and its pool's close() then waits forever.
        "tests/integration/test_skip_locked.py",
        "tests/integration/test_transport.py"
        "::test_ten_thousand_messages_eight_receivers_each_received_once",
        "tests/integration/test_receive_position.py",
    ),
)

DELAYED_DUE_EARLY = Defect(
    name="delayed-due-early",
    summary="a delayed message is due early: the store's fetch takes rows due within the next "
            "second",
    edits=(Edit(
        "endpoint_runtime/transport/sql/delayed.sql",
        "WHERE due <= statement_timestamp()\n",
        "WHERE due <= statement_timestamp() + interval '1 second'  -- MUTATION: 1 s early\n",
    ),),
    catchers=(
        "tests/integration/test_delayed.py"
        "::test_messages_arrive_no_earlier_than_due_by_the_databases_clock",
        "tests/e2e/test_recoverability.py::test_handler_defers_a_message_through_the_runtime",
        "tests/e2e/test_recoverability.py::test_immediate_then_delayed_retries_then_error_queue",
    ),
)

SAGA_VERSION_CHECK_DROPPED = Defect(
    name="saga-version-check-dropped",
    summary="a saga update without its version check: the UPDATE no longer requires the "
            "Concurrency it read, so a concurrent change is overwritten",
    edits=(Edit(
        "endpoint_runtime/chain/sagas/storage.py",
        """                f'"Concurrency" = $2 + 1 WHERE "Id" = $1 AND "Concurrency" = $2'),\n""",
        """                f'"Concurrency" = $2 + 1 WHERE "Id" = $1'),  # MUTATION: no check\n""",
    ),),
    catchers=(
        "tests/integration/test_sagas.py"
        "::test_an_optimistic_conflict_fails_the_attempt_and_the_retry_reads_afresh",
        "tests/integration/test_sagas.py"
        "::test_a_conflict_in_the_middle_of_a_batch_charges_only_the_conflicting_message",
        "tests/e2e/test_sagas_deployed.py::test_concurrent_updates_of_one_instance_lose_nothing",
    ),
)

AUDIT_BEFORE_COMMIT = Defect(
    name="audit-before-commit",
    summary="the audit copy is sent at once on its own connection, before (and whatever "
            "becomes of) the receive transaction's commit: a rolled-back attempt is audited",
    edits=(Edit(
        "endpoint_runtime/chain/steps.py",
        "                self.audit_address, audit_copy(context, self.endpoint),"
        " immediate=False)\n",
        "                self.audit_address, audit_copy(context, self.endpoint),"
        " immediate=True)\n",
    ),),
    catchers=(
        "tests/e2e/test_committed_counts.py"
        "::test_an_attempt_whose_commit_fails_is_not_processed_and_not_audited",
    ),
    notes="the atomic, batched and outbox modes send the copy at once; receive-only mode's "
          "dispatcher holds audit copies for the COMMIT whatever `immediate` says, and none "
          "mode has no transaction to escape",
)

DEFECTS: tuple[Defect, ...] = (
    ERROR_QUEUE_COPY_LOST,
    OUTBOX_DUPLICATE_PROCESSED,
    SKIP_LOCKED_DROPPED,
    DELAYED_DUE_EARLY,
    SAGA_VERSION_CHECK_DROPPED,
    AUDIT_BEFORE_COMMIT,
)
"""The catalogue, in the order the runs go: ``--defect NAME`` picks some."""
