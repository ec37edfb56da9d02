"""The re-drive audit table (B5): reading it, and which of its chunks have moved.

The audit table is an intent log. A re-drive writes a chunk's rows here first
(Delta app transaction ``redrive:<id>`` at version = chunk number), then
appends the chunk's new messages to the target table under the same app
transaction. A chunk has *moved* once its target table records that
transaction at the chunk's version or later; an audit row whose chunk has not
moved belongs to an interrupted re-drive that a re-run completes.

The audit table is also the claim log: a re-drive appends a chunk's rows only
as the next version after the audit version it planned from (see
:func:`retry_engine.delta.append_arrow`'s ``expect_version``), so two re-drives
running at once never both claim a dead letter.

Resolutions live here too (:mod:`retry_engine.ops.resolve`): rows whose
``target`` is ``resolve`` or ``purge`` mark a dead letter as handled by hand.
Their claim is the whole action (nothing is moved), so they count as moved as
soon as they are committed; :func:`redrive_rows` and :func:`resolution_rows`
tell the two kinds apart. No Spark here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from retry_engine.config import EngineConfig
from retry_engine.delta.tables import open_table, require_columns
from retry_engine.ops.terms import REDRIVE_TARGETS, RedriveTarget
from retry_engine.schemas import REDRIVE_AUDIT

MOVED = "moved"
AUDIT_TABLE = "redrive_audit"
MOVE_TARGETS: tuple[RedriveTarget, ...] = (*REDRIVE_TARGETS, "consumer")
RESOLVE_ACTIONS = ("resolve", "purge")


def app_id(redrive_id: str) -> str:
    """Delta app-transaction id of a re-drive, used on the audit and the target table."""
    return f"redrive:{redrive_id}"


@dataclass(frozen=True)
class AuditSnapshot:
    """The audit rows (plus ``moved``) of one audit table version."""

    rows: pa.Table
    version: int | None
    """The audit table version the rows are from; None when there is no audit table yet."""


def audit_snapshot(config: EngineConfig) -> AuditSnapshot:
    """The latest audit rows and the version they were read at (to claim against it)."""
    table = open_table(config.table_path(AUDIT_TABLE))
    if table is None:
        rows = REDRIVE_AUDIT.arrow_schema.empty_table()
    else:
        require_columns(table, REDRIVE_AUDIT.names, AUDIT_TABLE)
        rows = pa.table(table.to_pyarrow_table()).select(REDRIVE_AUDIT.names)
    version = None if table is None else table.version()
    return AuditSnapshot(rows.append_column(MOVED, _moved(config, rows)), version)


def read_audit(config: EngineConfig) -> pa.Table:
    """Every audit row plus a boolean ``moved`` column; empty when nothing was re-driven yet."""
    return audit_snapshot(config).rows


def moved_through(config: EngineConfig, redrive_id: str, target_table: str) -> int:
    """Highest chunk of ``redrive_id`` that reached ``target_table``; -1 when none did."""
    return _chunk_done(open_table(config.table_path(target_table)), redrive_id)


def _chunk_done(table: DeltaTable | None, redrive_id: str) -> int:
    done = None if table is None else table.transaction_version(app_id(redrive_id))
    return -1 if done is None else done


def _moved(config: EngineConfig, rows: pa.Table) -> pa.Array:
    if rows.num_rows == 0:
        return pa.array([], pa.bool_())
    pairs = rows.select(["redrive_id", "target_table"]).group_by(["redrive_id", "target_table"]).aggregate([])
    targets = pairs.column("target_table").to_pylist()
    # Each target table is opened once, however many re-drives wrote to it.
    opened = {target: open_table(config.table_path(target)) for target in set(targets)}
    through = {
        (rid, target): _chunk_done(opened[target], rid)
        for rid, target in zip(pairs.column("redrive_id").to_pylist(), targets, strict=True)
    }
    limits = pa.array(
        [
            through[(rid, target)]
            for rid, target in zip(
                rows.column("redrive_id").to_pylist(), rows.column("target_table").to_pylist(), strict=True
            )
        ],
        pa.int64(),
    )
    return pc.less_equal(rows.column("chunk"), limits)


def redrive_rows(audit: pa.Table) -> pa.Table:
    """The rows of re-drives and resends (not resolutions) among audit rows."""
    return audit.filter(pc.is_in(audit.column("target"), pa.array(MOVE_TARGETS, pa.string())))


def resolution_rows(audit: pa.Table) -> pa.Table:
    """The rows of resolutions (resolve, purge) among audit rows."""
    return audit.filter(pc.is_in(audit.column("target"), pa.array(RESOLVE_ACTIONS, pa.string())))
