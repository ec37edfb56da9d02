"""Resolve and purge dead letters: mark them handled, with a reason; remove them after a retention.

A dead letter an operator has dealt with (fixed by hand, a duplicate, an
order cancelled upstream) is *resolved*: marked, never silently deleted. The
mark is a row in the audit table (the same table re-drives claim dead letters
in, see :mod:`retry_engine.ops.audit`) with ``target`` = ``resolve`` or ``purge``,
who (``operator``), when (``redriven_at``) and why (``note``: the reason).
Resolved dead letters are left out of ``dlq list`` (unless asked for) and of
every later re-drive, forced or not.

Resolve versus re-drive
    A resolve claims its dead letters like a re-drive claims a chunk: its
    audit rows commit only as the audit table's next version after the one it
    planned from (``append_arrow(expect_version=...)``), else it plans again.
    Re-drives claim the same way, so when a resolve and a re-drive race for a
    dead letter, exactly one claim lands first and the other sees it on its
    next plan: a re-drive skips resolved dead letters; a resolve stops with
    ``REDRIVE_UNFINISHED`` on dead letters a re-drive has claimed and not yet
    moved, and skips ones a re-drive moved (unless ``include_redriven``). A
    dead letter is never both re-driven and resolved by racing commands.

Retention
    *Purge* is resolve plus "remove it": :func:`expire` deletes purged dead
    letters from the DLQ table at once, and resolved ones once their
    resolution is older than ``dlq.resolved_retention`` (default 30 days).
    The removal rewrites the group's partition of the DLQ table without those
    rows (older table versions keep them until vacuumed); the audit rows stay, so
    ``dlq show`` still says who resolved what, when and why.

No Spark here: delta-rs on the driver.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError

from retry_engine.clients.dlq import Selection, read_dlq
from retry_engine.config import EngineConfig
from retry_engine.core.delays import bounded_duration_ms
from retry_engine.delta.storage import open_delta
from retry_engine.delta.tables import (
    append_arrow,
    ensure_table,
    open_table,
    pyarrow_dataset,
    table_arrow_schema,
)
from retry_engine.errors import ConcurrentWriteError, ConfigError, RedriveError
from retry_engine.ops.audit import (
    AUDIT_TABLE,
    MOVED,
    RESOLVE_ACTIONS,
    app_id,
    audit_snapshot,
    read_audit,
    redrive_rows,
    resolution_rows,
)
from retry_engine.ops.redrive import MAX_CLAIM_ATTEMPTS, whoami
from retry_engine.schemas import REDRIVE_AUDIT

log = logging.getLogger(__name__)

Action = Literal["resolve", "purge"]
MAX_REASON_LENGTH = 2000
# Rewrites of one partition that lose to the engine's appends before giving up (run it again then).
MAX_DELETE_ATTEMPTS = 10


@dataclass(frozen=True)
class ResolveReport:
    """What a resolve or purge did (or, for a dry run, would do)."""

    resolution_id: str
    action: Action
    reason: str
    dry_run: bool
    matched: int
    """Dead letters the selection matched."""
    resolved: int
    """Dead letters marked by this command (dry run: that would be)."""
    already_resolved: int
    redriven: int
    """Matched dead letters left alone because a re-drive moved them (see ``include_redriven``)."""
    rows: pd.DataFrame = field(repr=False)
    """The dead letters marked (dry run: that would be): msg id, group, topic, reason code, dead-lettered at."""


def resolve(
    config: EngineConfig,
    selection: Selection,
    *,
    reason: str,
    action: Action = "resolve",
    operator: str | None = None,
    include_redriven: bool = False,
    dry_run: bool = False,
    on_planned: Callable[[ResolveReport], None] | None = None,
) -> ResolveReport:
    """Mark the dead letters ``selection`` matches as resolved (or purged), with ``reason``.

    Already resolved ones are skipped; so are ones a re-drive moved unless
    ``include_redriven``; ones a re-drive claimed but has not moved yet are an
    error (``REDRIVE_UNFINISHED``) naming that re-drive. Idempotent in effect:
    running it again marks nothing more. ``on_planned`` is called with each
    plan before it is claimed (a plan whose claim fails is made again); an
    exception it raises stops the resolve with nothing written.
    """
    if action not in RESOLVE_ACTIONS:
        raise ConfigError(
            f"action {action!r} is not one of {', '.join(RESOLVE_ACTIONS)}", code="INVALID_OPTION"
        )
    reason = check_reason(reason)
    operator = operator or whoami()
    resolution_id = f"{'rs' if action == 'resolve' else 'pg'}-{uuid.uuid4().hex[:16]}"
    audit_path = config.table_path(AUDIT_TABLE)
    for _ in range(MAX_CLAIM_ATTEMPTS):
        snapshot = audit_snapshot(config)
        matched = read_dlq(config, selection).sort_by(
            [("dead_lettered_at", "ascending"), ("msg_id", "ascending")]
        )
        ids = matched.column("msg_id").to_pylist()
        resolved_ids = set(resolution_rows(snapshot.rows).column("dlq_msg_id").to_pylist())
        redrives = redrive_rows(snapshot.rows)
        pending = redrives.filter(pc.invert(redrives.column(MOVED)))
        claimed = dict(
            zip(
                pending.column("dlq_msg_id").to_pylist(),
                pending.column("redrive_id").to_pylist(),
                strict=True,
            )
        )
        busy = sorted({claimed[i] for i in ids if i in claimed and i not in resolved_ids})
        if busy:
            raise RedriveError(
                f"{sum(1 for i in ids if i in claimed)} selected dead letters are claimed by unfinished re-drive(s) "
                f"{', '.join(busy)}; let it finish (retry-engine dlq redrive --resume {busy[0]}) or leave them out",
                code="REDRIVE_UNFINISHED",
            )
        moved = set(redrives.filter(redrives.column(MOVED)).column("dlq_msg_id").to_pylist())
        keep = [i not in resolved_ids and (include_redriven or i not in moved) for i in ids]
        chosen = matched.filter(pa.array(keep, pa.bool_()))
        report = ResolveReport(
            resolution_id=resolution_id,
            action=action,
            reason=reason,
            dry_run=dry_run,
            matched=len(ids),
            resolved=chosen.num_rows,
            already_resolved=sum(1 for i in ids if i in resolved_ids),
            redriven=sum(
                1 for i in ids if i in moved and i not in resolved_ids and not include_redriven
            ),
            rows=chosen.select(
                ["msg_id", "consumer_group", "retry_topic", "reason_code", "dead_lettered_at"]
            ).to_pandas(),
        )
        if dry_run or chosen.num_rows == 0:
            return report
        if snapshot.version is None:
            # Claims are commits against a checked audit version: create the table, then look again.
            ensure_table(audit_path, REDRIVE_AUDIT.arrow_schema, add_missing=True)
            continue
        if on_planned is not None:
            on_planned(report)
        rows = _audit_rows(
            chosen,
            resolution_id=resolution_id,
            action=action,
            reason=reason,
            operator=operator,
            selection=selection.describe(),
        )
        try:
            append_arrow(
                audit_path,
                rows,
                app_id=app_id(resolution_id),
                txn_version=0,
                expect_version=snapshot.version,
            )
        except ConcurrentWriteError as exc:
            # A re-drive or another resolve claimed something since the plan: plan again.
            log.info(
                "%s %s: the audit table changed while claiming (%s); planning again",
                action,
                resolution_id,
                exc,
            )
            continue
        log.info(
            "%s %s by %s: %d dead letters marked (%s)",
            action,
            resolution_id,
            operator,
            chosen.num_rows,
            reason,
        )
        return report
    raise RedriveError(
        f"{action}: other re-drives or resolves claimed dead letters first {MAX_CLAIM_ATTEMPTS} times in a row; "
        "run it again",
        code="REDRIVE_CONTENDED",
    )


def check_reason(reason: object) -> str:
    """The reason, stripped; ``INVALID_REASON`` when it is missing, blank or too long."""
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigError(
            f'a reason is required (who will read it: the next operator), got {reason!r}; e.g. --reason "fixed upstream"',
            code="INVALID_REASON",
        )
    reason = reason.strip()
    if len(reason) > MAX_REASON_LENGTH:
        raise ConfigError(
            f"the reason is {len(reason)} characters; at most {MAX_REASON_LENGTH}",
            code="INVALID_REASON",
        )
    return reason


def _audit_rows(
    dead: pa.Table,
    *,
    resolution_id: str,
    action: Action,
    reason: str,
    operator: str,
    selection: str,
) -> pa.Table:
    now = dt.datetime.now(dt.UTC)
    rows = [
        {
            "redrive_id": resolution_id,
            "chunk": 0,
            "operator": operator,
            "note": reason,
            "selection": selection,
            "target": action,
            "reset_reconsume_times": False,
            "consumer_group": d["consumer_group"],
            "retry_topic": d["retry_topic"],
            "dlq_msg_id": d["msg_id"],
            "origin_msg_id": d["origin_msg_id"],
            "reason_code": d["reason_code"],
            # Nothing new is written: the "new" id is the dead letter's own.
            "redriven_msg_id": d["msg_id"],
            "topic": d["topic"],
            # The claim is the whole action: it "moved" once the audit table records its transaction.
            "target_table": AUDIT_TABLE,
            "reconsume_times": d["reconsume_times"],
            "redriven_at": now,
        }
        for d in dead.select(
            [
                "consumer_group",
                "retry_topic",
                "msg_id",
                "origin_msg_id",
                "reason_code",
                "topic",
                "reconsume_times",
            ]
        ).to_pylist()
    ]
    return pa.Table.from_pylist(rows, schema=REDRIVE_AUDIT.arrow_schema)


# -- retention ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpireReport:
    """What :func:`expire` removed from the DLQ table (or, for a dry run, would remove)."""

    dry_run: bool
    removed: int
    purged: int
    """Of ``removed``: purged dead letters (removed whatever their age)."""
    retention: str
    rows: pd.DataFrame = field(repr=False)
    """msg id, group, action, resolution id, resolved at."""


def expire(
    config: EngineConfig,
    *,
    retention: str | None = None,
    dry_run: bool = False,
    now: dt.datetime | None = None,
) -> ExpireReport:
    """Delete purged dead letters, and resolved ones older than ``retention``, from the DLQ table.

    ``retention`` defaults to ``dlq.resolved_retention``. The audit rows stay.
    A run that finds nothing to remove commits nothing; running it twice
    removes nothing more. A stream reading the DLQ table needs Delta's
    ``skipChangeCommits`` to read past these deletes.
    """
    retention = config.dlq.resolved_retention if retention is None else retention
    keep_ms = bounded_duration_ms(retention)
    now = now or dt.datetime.now(dt.UTC)
    cutoff = now - dt.timedelta(milliseconds=keep_ms)
    marks = resolution_rows(read_audit(config))
    due = [
        m
        for m in marks.select(
            ["redrive_id", "target", "dlq_msg_id", "consumer_group", "redriven_at"]
        ).to_pylist()
        if m["target"] == "purge" or m["redriven_at"] <= cutoff
    ]
    path = config.table_path("dlq")
    table = open_table(path)
    if table is None or not due:
        return ExpireReport(
            dry_run,
            0,
            0,
            retention,
            pd.DataFrame(
                columns=["msg_id", "consumer_group", "action", "resolution_id", "resolved_at"]
            ),
        )
    present = set(read_dlq(config, columns=("msg_id",)).column("msg_id").to_pylist())
    first: dict[str, dict[str, object]] = {}
    for m in due:
        if m["dlq_msg_id"] in present:
            first.setdefault(m["dlq_msg_id"], m)
    rows = pd.DataFrame(
        [
            {
                "msg_id": i,
                "consumer_group": m["consumer_group"],
                "action": m["target"],
                "resolution_id": m["redrive_id"],
                "resolved_at": m["redriven_at"],
            }
            for i, m in first.items()
        ],
        columns=["msg_id", "consumer_group", "action", "resolution_id", "resolved_at"],
    )
    purged = int((rows["action"] == "purge").sum())
    if dry_run or rows.empty:
        return ExpireReport(dry_run, len(rows), purged, retention, rows)
    for group, ids in rows.groupby("consumer_group")["msg_id"]:
        _remove(path, str(group), set(ids))
    log.info(
        "removed %d resolved dead letters (%d purged) from %s; retention %s",
        len(rows),
        purged,
        path,
        retention,
    )
    return ExpireReport(dry_run, len(rows), purged, retention, rows)


def _sql_string(value: str) -> str:
    # A SQL string literal: the only special character inside '...' is the quote itself.
    return "'" + value.replace("'", "''") + "'"


def _remove(path: str, group: str, ids: set[str]) -> int:
    """Rewrite one group's DLQ partition without these dead letters; the number removed.

    Not ``DeltaTable.delete``: deltalake 1.6 rewrites files through DataFusion
    with ``string_view`` columns, which pyarrow datasets then cannot filter
    (``dlq.history`` fails on them). This writes the kept rows back with the
    table's own schema, replacing the files it read: when the engine appends
    dead letters to the group meanwhile, the commit fails (delta-rs sees the
    concurrent append) and the partition is read again, so none is lost.
    """
    wanted = pa.array(sorted(ids), pa.string())
    for attempt in range(1, MAX_DELETE_ATTEMPTS + 1):
        table = open_delta(path)
        rows = pyarrow_dataset(table, [("consumer_group", "=", group)]).to_table(filter=pc.field("consumer_group") == group)
        rows = rows.select(table_arrow_schema(table).names).cast(table_arrow_schema(table))
        gone = pc.is_in(rows.column("msg_id"), wanted)
        removed = int(pc.sum(gone).as_py() or 0)
        if removed == 0:
            return 0
        try:
            write_deltalake(
                table,
                rows.filter(pc.invert(gone)),
                mode="overwrite",
                predicate=f"consumer_group = {_sql_string(group)}",
                # The table's own layout: another writer's DLQ may not be partitioned by group.
                partition_by=table.metadata().partition_columns or None,
            )
            return removed
        except CommitFailedError as exc:
            # Someone rewrote this partition meanwhile (another expire): read it again.
            log.info(
                "%s: rewrite of group %s conflicted (attempt %d): %s", path, group, attempt, exc
            )
    raise ConcurrentWriteError(
        f"{path}: removing {len(ids)} resolved dead letters of {group} kept conflicting; run it again"
    )
