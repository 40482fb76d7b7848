"""The shape of the conversations: the flow graph, and each conversation end to end.

An edge of the flow graph is (sending endpoint -> processing endpoint, message type), from the
audit copies' originating and processing endpoints; its latency is the critical time (sent to
processed). A conversation is the audit copies sharing a conversation id: it starts with its
first send and ends with its last processing end. Its initiating message is the earliest one
that is related to no other (``related_to`` empty: sent from outside a handler), else the
earliest one. Audit copies without a processing end are left out (the report counts them).

A conversation belongs to the day it started. An incremental run rewrites a day whole: it
finds the conversations its new rows touch, the days they started on before and after them
(:func:`touched_days`), and recomputes every conversation of those days from the extract's
rows (:func:`conversations_of_days`): every row of a conversation that started on day d ended
on d or later, so the conversations of d are found, whole, among the rows of those days
(those that started earlier are left out).

Which conversations started before, and where: the ``conversations`` table the runs before
wrote holds each conversation of the old rows once, under its start day, so a run reads it
(one row per conversation) instead of every old row of the extract. Until retention
(``--keep-days``) deletes a day: it deletes a conversation's start day from the table while
rows of it processed the next day stay in the extract; from then on
(``Manifest.expired_before``) the old rows decide, as before the table was used.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import date, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from endpoint_runtime.analytics.measures import (
    audit_endpoint,
    day,
    merged,
    message_type,
    quantiles,
    sending_endpoint,
    sketch,
)

SLOWEST = 20
EDGE_KEYS = ("sender", "receiver", "message_type")


def flow_edges(audit: DataFrame) -> DataFrame:
    """Per day and edge: message count, critical time sketch and p50/p95/p99 (ms)."""
    rows = audit.where(F.col("processing_ended").isNotNull()).select(
        day("processing_ended"), sending_endpoint().alias("sender"),
        audit_endpoint().alias("receiver"), message_type().alias("message_type"),
        "critical_time_ms", "processing_ended")
    keys = ["day", *EDGE_KEYS]
    grouped = rows.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("messages"),
        sketch("critical_time_ms", "latency_sketch"),
        F.min("processing_ended").alias("first_seen"),
        F.max("processing_ended").alias("last_seen"),
    )
    return grouped.select(*keys, "messages", *quantiles("latency_sketch", "latency_ms"),
                          "first_seen", "last_seen", "latency_sketch")


def edges_overall(daily: DataFrame) -> DataFrame:
    """The per-day edges merged over every day (the sketches merge)."""
    keys = list(EDGE_KEYS)
    grouped = daily.groupBy(*keys).agg(
        F.sum("messages").alias("messages"), merged("latency_sketch"),
        F.min("first_seen").alias("first_seen"), F.max("last_seen").alias("last_seen"))
    return grouped.select(*keys, "messages", *quantiles("latency_sketch", "latency_ms"),
                          "first_seen", "last_seen")


def _sent() -> Column:
    return F.coalesce(F.col("time_sent"), F.col("processing_started"),
                      F.col("processing_ended"))


def touched_days(old: DataFrame, new: DataFrame, new_errors: DataFrame,
                 known: DataFrame | None = None) -> set[str]:
    """The start days, before and after the new rows, of the conversations they touch.
    ``known``: the ``conversations`` table as the runs before wrote it (one row per
    conversation of ``old``, under its start day), read instead of ``old``'s rows."""
    touched = (new.select("conversation_id").unionByName(new_errors.select("conversation_id"))
               .where(F.col("conversation_id").isNotNull()).distinct())
    ended = F.col("processing_ended").isNotNull()
    if known is None:
        rows = (old.withColumn("new", F.lit(False))
                .unionByName(new.withColumn("new", F.lit(True)))
                .where(ended)
                .join(F.broadcast(touched), "conversation_id", "left_semi"))
        starts = rows.groupBy("conversation_id").agg(
            F.min(_sent()).alias("now"), F.min(F.when(~F.col("new"), _sent())).alias("before"))
    else:
        # The runs before computed each start (the least send of its rows, ended ones only,
        # as here): the start now is the lesser of it and the new rows' least send.
        seen = known.select("conversation_id", F.col("started").alias("before")).join(
            F.broadcast(touched), "conversation_id", "left_semi")
        arrived = new.where(ended).groupBy("conversation_id").agg(
            F.min(_sent()).alias("arrived"))
        starts = seen.join(arrived, "conversation_id", "full_outer").select(
            F.least("before", "arrived").alias("now"), "before")
    days = starts.select(F.explode(F.array(
        F.date_format("now", "yyyy-MM-dd"), F.date_format("before", "yyyy-MM-dd"))).alias("d"))
    return {row["d"] for row in days.where(F.col("d").isNotNull()).distinct().collect()}


def conversations_of_days(audit: DataFrame, errors: DataFrame, days: Collection[str],
                          known: DataFrame | None = None) -> DataFrame:
    """The conversations that started on ``days``, from every row of theirs. ``known``: as
    in :func:`touched_days`."""
    if not days:
        return conversations(audit.limit(0), errors.limit(0))
    earliest = (date.fromisoformat(min(days)) - timedelta(days=1)).isoformat()  # clock skew
    recent = audit.where(F.col("day") >= earliest)
    # A conversation with a row on an earlier day started before ``days``: left out, so
    # that the rest have all their rows among the recent ones. Known from the table's
    # start days when it is given (a fifth of the rows or less), else from the rows'
    # conversation ids (one column of every earlier row).
    starts = audit if known is None else known  # ``day``: its processing or its start day
    before = starts.where(F.col("day") < earliest).select("conversation_id")
    candidates = (recent.select("conversation_id").where(F.col("conversation_id").isNotNull())
                  .distinct().join(before, "conversation_id", "left_anti"))
    rows = recent.join(candidates, "conversation_id", "left_semi")
    failed = errors.join(candidates, "conversation_id", "left_semi")
    return conversations(rows, failed).where(F.col("day").isin(sorted(days)))


def conversations(audit: DataFrame, errors: DataFrame) -> DataFrame:
    """One row per conversation id: start, end, duration, messages, endpoints, retries,
    failed messages, initiating type and endpoint; ``day`` is the day it started."""
    sent = _sent()
    first = F.struct(sent.alias("at"), message_type().alias("message_type"),
                     sending_endpoint().alias("sender"))
    grouped = audit.where(F.col("conversation_id").isNotNull()
                          & F.col("processing_ended").isNotNull()).groupBy("conversation_id").agg(
        F.min(sent).alias("started"),
        F.max("processing_ended").alias("ended"),
        F.count(F.lit(1)).alias("messages"),
        F.array_sort(F.collect_set(audit_endpoint())).alias("endpoints"),
        F.sum("retries").alias("retries"),
        F.min(F.when(F.col("related_to").isNull(), first)).alias("root"),
        F.min(first).alias("earliest"),
    )
    failed = (errors.where(F.col("conversation_id").isNotNull()
                           & F.col("time_of_failure").isNotNull()).groupBy("conversation_id")
              .agg(F.count(F.lit(1)).alias("failed")))
    joined = grouped.join(failed, "conversation_id", "left")
    initiator = F.coalesce(F.col("root"), F.col("earliest"))
    duration = (F.unix_micros(F.col("ended")) - F.unix_micros(F.col("started"))) / F.lit(1000.0)
    return joined.select(
        day("started"), "conversation_id", "started", "ended",
        duration.alias("duration_ms"), "messages", "endpoints",
        F.col("retries").cast("long").alias("retries"),
        F.coalesce(F.col("failed"), F.lit(0)).cast("long").alias("failed"),
        initiator["message_type"].alias("initiating_type"),
        initiator["sender"].alias("initiating_endpoint"),
    )


def slowest(conversation_rows: DataFrame, top: int = SLOWEST) -> DataFrame:
    return conversation_rows.orderBy(F.col("duration_ms").desc(), "conversation_id").limit(top)
