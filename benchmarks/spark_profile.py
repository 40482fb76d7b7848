"""Where a Spark application's time goes, from its event log (``spark.eventLog.enabled``):
per job description (the report names its jobs after its stages, ``report: minutes``), how
many jobs, stages and tasks ran and how long the jobs took, within a window of wall-clock
time; and when the application started.

Example::

    log = newest_log(directory, after_ms)
    profile(log, since_ms, until_ms)
    # {"started_ms": ..., "first_job_ms": ..., "by_stage": {"report: minutes": {...}}, ...}
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

CONF_DIR = "spark.eventLog.dir"


def conf(directory: Path) -> list[tuple[str, str]]:
    """The Spark settings that write an uncompressed event log into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return [("spark.eventLog.enabled", "true"), (CONF_DIR, f"file://{directory}"),
            ("spark.eventLog.compress", "false"), ("spark.eventLog.rolling.enabled", "false")]


def newest_log(directory: Path) -> Path:
    """The newest application's log (a file, or the last events file of a rolling log)."""
    return max((p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")
                and not p.name.startswith("appstatus")), key=lambda p: p.stat().st_mtime)


def profile(log: Path, since_ms: float = 0, until_ms: float = float("inf")) -> dict[str, Any]:
    """The jobs submitted in ``[since_ms, until_ms)`` (epoch milliseconds), by description."""
    started: dict[int, tuple[float, str, int, int]] = {}
    by_stage: dict[str, dict[str, float]] = defaultdict(
        lambda: {"jobs": 0, "stages": 0, "tasks": 0, "job_s": 0.0})
    application_ms = None
    first_job_ms = None
    last_job_end_ms = None
    with log.open(encoding="utf-8") as lines:
        for line in lines:
            event = json.loads(line)
            kind = event["Event"]
            if kind == "SparkListenerApplicationStart":
                application_ms = event["Timestamp"]
            elif kind == "SparkListenerJobStart":
                submitted = event["Submission Time"]
                if not since_ms <= submitted < until_ms:
                    continue
                description = (event.get("Properties") or {}).get(
                    "spark.job.description") or "(unnamed)"
                stages = event.get("Stage Infos", [])
                tasks = sum(stage.get("Number of Tasks", 0) for stage in stages)
                started[event["Job ID"]] = (submitted, description, len(stages), tasks)
                first_job_ms = submitted if first_job_ms is None else first_job_ms
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in started:
                submitted, description, stages, tasks = started.pop(event["Job ID"])
                figures = by_stage[description]
                figures["jobs"] += 1
                figures["stages"] += stages
                figures["tasks"] += tasks
                figures["job_s"] += (event["Completion Time"] - submitted) / 1000
                last_job_end_ms = event["Completion Time"]
    return {
        "application_started_ms": application_ms,
        "first_job_ms": first_job_ms,
        "last_job_end_ms": last_job_end_ms,
        "jobs": int(sum(f["jobs"] for f in by_stage.values())),
        "job_s": round(sum(f["job_s"] for f in by_stage.values()), 2),
        "by_stage": {name: {key: round(value, 2) for key, value in figures.items()}
                     for name, figures in sorted(by_stage.items())},
    }
