"""The shape of the conversations: the flow graph, and each conversation end to end.

An edge of the flow graph is (sending endpoint -> processing endpoint, message type), from the
audit copies' originating and processing endpoints; its latency is the critical time (sent to
processed). A conversation is the audit copies sharing a conversation id: it starts with its
first send and ends with its last processing end. Its initiating message is the earliest one
that is related to no other (``related_to`` empty: sent from outside a handler), else the
earliest one.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from endpoint_runtime.analytics.measures import (
    audit_endpoint,
    day,
    message_type,
    percentiles,
    sending_endpoint,
    spread,
)

SLOWEST = 20
EDGE_KEYS = ("sender", "receiver", "message_type")


def flow_edges(audit: DataFrame, by_day: bool = False) -> DataFrame:
    """Edges with their message count and critical time p50/p95/p99 (ms)."""
    columns: list[Column | str] = [
        sending_endpoint().alias("sender"), audit_endpoint().alias("receiver"),
        message_type().alias("message_type"), "critical_time_ms", "processing_ended"]
    keys = list(EDGE_KEYS)
    if by_day:
        columns.append(day("processing_ended"))
        keys.insert(0, "day")
    grouped = audit.select(*columns).groupBy(*keys).agg(
        F.count(F.lit(1)).alias("messages"),
        percentiles("critical_time_ms", "latency_ms"),
        F.min("processing_ended").alias("first_seen"),
        F.max("processing_ended").alias("last_seen"),
    )
    return grouped.select(*keys, "messages", *spread("latency_ms"), "first_seen", "last_seen")


def conversations(audit: DataFrame, errors: DataFrame) -> DataFrame:
    """One row per conversation id: start, end, duration, messages, endpoints, retries,
    failed messages, initiating type and endpoint; ``day`` is the day it started."""
    sent = F.coalesce(F.col("time_sent"), F.col("processing_started"))
    first = F.struct(sent.alias("at"), message_type().alias("message_type"),
                     sending_endpoint().alias("sender"))
    grouped = audit.where(F.col("conversation_id").isNotNull()).groupBy("conversation_id").agg(
        F.min(sent).alias("started"),
        F.max("processing_ended").alias("ended"),
        F.count(F.lit(1)).alias("messages"),
        F.array_sort(F.collect_set(audit_endpoint())).alias("endpoints"),
        F.sum("retries").alias("retries"),
        F.min(F.when(F.col("related_to").isNull(), first)).alias("root"),
        F.min(first).alias("earliest"),
    )
    failed = (errors.where(F.col("conversation_id").isNotNull()).groupBy("conversation_id")
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
