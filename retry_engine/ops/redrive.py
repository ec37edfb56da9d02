"""Re-drive (B5): send dead letters back to their original topic or to the retry path.

Like SQS's DLQ redrive: filtered (:class:`~retry_engine.clients.dlq.Selection`),
rate-limited, with a dry run and an audit record; and exactly once.

How exactly once works
    A re-drive has an id: given, or derived from the selection, target and
    reset flag, so running the same command again *is* the same re-drive.
    Its dead letters are taken oldest first in chunks. For chunk ``k`` it
    first appends the chunk's audit rows (who, what, when, the new message
    ids) to the audit table, then the new messages to the target table; both
    commits carry the Delta app transaction ``(redrive:<id>, k)`` and are
    skipped when the table already records it (delta-rs does not check this
    itself, see :func:`retry_engine.delta.append_arrow`). A run interrupted
    anywhere leaves either nothing, or audit rows whose chunk has not reached
    its target: the next run of the same re-drive finishes those chunks from
    the audit rows (same new ids) before it plans new ones. A dead letter
    that any re-drive moved is skipped by later selections unless
    ``force=True``; one planned by another unfinished re-drive is an error
    that names that re-drive.

Re-drives running at the same time
    The audit append of a new chunk is its *claim*: it commits only as the
    audit table's next version after the one the plan was read from (Delta
    appends never conflict with each other, so this is checked explicitly,
    see ``append_arrow(expect_version=...)``). If anyone claimed anything in
    between, the claim fails, nothing is written, and the re-drive plans
    again from the new audit version: dead letters another re-drive claimed
    meanwhile are then an error naming it (or skipped once it moved them),
    and chunks another run of the *same* re-drive claimed are finished from
    their audit rows. So each dead letter moves at most once, and the target
    table holds exactly the messages of the audit rows whose chunk moved,
    whatever runs concurrently. Chunks of one re-drive move in chunk order
    (a run finishes every claimed chunk before it claims the next), which is
    what lets the target's transaction version say which chunks moved.

The new message is marked: properties ``REDRIVE_ID``, ``REDRIVE_FROM_MSG_ID``
and ``REDRIVE_COUNT`` (copied by later retries, so a message that dies again
shows it was re-driven). The DLQ itself is never modified (R9: append-only).
No Spark here: delta-rs on the driver, so the CLI starts in a second.
"""

from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from retry_engine.clients.dlq import (
    LIGHT_COLUMNS,
    PROP_REDRIVE_FROM,
    PROP_REDRIVE_ID,
    Selection,
    dead_letters_named,
    read_dlq,
    selection_consumer,
)
from retry_engine.config import EngineConfig
from retry_engine.core.decide import new_msg_id
from retry_engine.core.names import (
    PROP_REDRIVE_COUNT,
    PROP_RESEND_MSG_ID,
    PROP_RESEND_TO,
    TOPIC_MAX_LENGTH,
    delivery_key,
    is_whole,
    name_problem,
    named_like_a_topic,
    redrive_count,
    retry_topic,
)
from retry_engine.delta.tables import (
    append_arrow,
    check_append,
    ensure_table,
    open_table,
    table_arrow_schema,
    table_version,
)
from retry_engine.errors import ConcurrentWriteError, ConfigError, RedriveError
from retry_engine.ops.audit import (
    AUDIT_TABLE,
    MOVED,
    app_id,
    audit_snapshot,
    read_audit,
    redrive_rows,
    resolution_rows,
)
from retry_engine.ops.redrive_tasks import Cancelled, RunTracker
from retry_engine.ops.terms import DEFAULT_CHUNK_SIZE, REDRIVE_TARGETS, RedriveTarget
from retry_engine.ops.terms import RESEND_TARGET as RESEND_TARGET
from retry_engine.schemas import DLQ, MESSAGES, REDRIVE_AUDIT, RETRY

log = logging.getLogger(__name__)

Target = RedriveTarget
TARGETS: tuple[Target, ...] = REDRIVE_TARGETS
TARGET_TABLES: dict[str, str] = {"topic": "messages", "retry": "retry"}
# ``dlq resend`` (retry_engine.ops.resend): a %RETRY%G row only one consumer instance delivers.
# Not a --to of ``dlq redrive``: it needs the instance, recorded in the audit's selection.
TARGET_TABLES[RESEND_TARGET] = "retry"
REDRIVE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Claims a re-drive may lose in a row before it gives up. Each lost claim is another
# re-drive's claim, and there are only as many claims as chunks of work, so a re-drive
# cannot loop forever; this bound only stops one that is starved by a storm of others
# (a faster run of the same id can legitimately win dozens of chunks in a row).
MAX_CLAIM_ATTEMPTS = 1000

Phase = Literal["planned", "moved"]


@dataclass(frozen=True)
class ChunkProgress:
    """Reported after each commit of a chunk: ``planned`` (audit written), then ``moved``."""

    redrive_id: str
    chunk: int
    phase: Phase
    messages: int
    moved_so_far: int
    total: int


@dataclass(frozen=True)
class RedriveReport:
    """What a re-drive did (or, for a dry run, would do)."""

    redrive_id: str
    target: Target
    dry_run: bool
    matched: int
    """Dead letters the selection matched."""
    skipped: int
    """Matched dead letters left alone: already moved by a re-drive (and not forced)."""
    resumed: int
    """Messages of this re-drive's interrupted chunks that this run completed (or would)."""
    moved: int
    """Messages moved by this run (resumed ones included); 0 for a dry run."""
    remaining: int
    """Messages left for a later run because ``max_chunks`` stopped this one (dry run: would stop)."""
    plan: pd.DataFrame = field(repr=False)
    """One row per message this run moves (or would): dead letter, new id, target, chunk."""
    resolved: int = 0
    """Matched dead letters left alone because they are resolved (even when forced; see retry_engine.ops.resolve)."""
    cancelled: str | None = None
    """Who cancelled this run and why (``retry-engine redrive cancel``); None when it was not cancelled."""
    dlq_version: int | None = None
    """The DLQ version the (last) plan read: pass it to the run a dry run was confirmed for."""

    @property
    def complete(self) -> bool:
        return self.remaining == 0


class RateLimiter:
    """At most ``rate`` messages per second, enforced after each chunk.

    A stall (a slow chunk, a store that answered late) earns at most :data:`CATCH_UP_SECONDS` of
    sending: the rate it protects is the consumers', and a plain average let the chunks after a 30 s
    stall through with no pause until 30 s worth of messages had gone out at once.
    """

    CATCH_UP_SECONDS = 1.0

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate is not None and not rate > 0:
            raise ConfigError(
                f"rate must be a positive number of messages per second, got {rate!r}",
                code="INVALID_OPTION",
            )
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._due = clock()  # when what was sent so far may have gone out at the rate

    def after(self, messages: int) -> float:
        """Record ``messages`` sent; sleep until the rate is back under the limit."""
        if self.rate is None:
            return 0.0
        now = self._clock()
        self._due = max(self._due, now - self.CATCH_UP_SECONDS) + messages / self.rate
        wait = self._due - now
        if wait > 0:
            self._sleep(wait)
            return wait
        return 0.0


def default_redrive_id(selection: Selection, *, target: Target, reset_reconsume_times: bool) -> str:
    """The id of "this selection, to this target": running the same command again resumes it."""
    key = f"{selection.describe()}\0{target}\0{reset_reconsume_times}"
    return "rd-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def redriven_msg_id(redrive_id: str, dlq_msg_id: str, generation: int) -> str:
    """Deterministic id of the message a re-drive writes for one dead letter (as the engine mints its ids)."""
    return new_msg_id(f"redrive\0{redrive_id}", dlq_msg_id, str(generation))


def redrive(
    config: EngineConfig,
    selection: Selection,
    *,
    target: Target,
    reset_reconsume_times: bool = True,
    dry_run: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    rate: float | None = None,
    max_chunks: int | None = None,
    force: bool = False,
    redrive_id: str | None = None,
    operator: str | None = None,
    note: str | None = None,
    on_progress: Callable[[ChunkProgress], None] | None = None,
    dlq_version: int | None = None,
) -> RedriveReport:
    """Re-drive the dead letters ``selection`` matches to ``target``; see the module docstring.

    ``target="topic"`` appends each as a new message of its original topic to
    the messages table; ``"retry"`` appends it to the retry table as a
    ``%RETRY%G`` row the group's consumers read at once. ``reset_reconsume_times``
    starts the retry ladder again at 0 (else the count is kept, so one more
    failure dead-letters it again). ``rate`` is messages per second;
    ``max_chunks`` stops after that many chunks (the rest is moved by a re-run).
    ``force`` also re-drives dead letters an earlier re-drive moved; a forced
    re-drive without ``redrive_id`` gets a fresh id (printed in the report:
    pass it to resume). ``on_progress`` is called after each commit; an
    exception it raises stops the re-drive (a re-run resumes it).
    ``dlq_version``: match the DLQ as of that version (the one a confirmed dry
    run read, :attr:`RedriveReport.dlq_version`), so dead letters written since
    are not moved unseen; default the latest.
    """
    if target not in TARGETS:
        raise ConfigError(
            f"target {target!r} is not one of {', '.join(TARGETS)}", code="INVALID_OPTION"
        )
    return _redrive(
        config,
        selection,
        target=target,
        reset_reconsume_times=reset_reconsume_times,
        dry_run=dry_run,
        chunk_size=chunk_size,
        rate=rate,
        max_chunks=max_chunks,
        force=force,
        redrive_id=redrive_id,
        operator=operator,
        note=note,
        on_progress=on_progress,
        dlq_version=dlq_version,
    )


@dataclass(frozen=True)
class _Plan:
    """What one look at the audit table decides: the chunks to move, in order, and the counts."""

    chunks: list[tuple[pa.Table, bool]]
    """(audit rows of the chunk, whether it was claimed before this look and is being resumed)."""
    audit_version: int | None
    matched: int
    skipped: int
    resolved: int
    total: int
    matched_rows: pa.Table
    """The matched dead letters' :data:`~retry_engine.clients.dlq.LIGHT_COLUMNS` (no body), at ``dlq_version``."""
    dlq_version: int | None
    moved_before: int
    """Messages of this re-drive that earlier runs moved."""


def _redrive(
    config: EngineConfig,
    selection: Selection | None,
    *,
    target: Target,
    reset_reconsume_times: bool,
    dry_run: bool,
    chunk_size: int,
    rate: float | None,
    max_chunks: int | None,
    force: bool,
    redrive_id: str | None,
    operator: str | None,
    note: str | None,
    on_progress: Callable[[ChunkProgress], None] | None,
    dlq_version: int | None = None,
) -> RedriveReport:
    if target not in TARGET_TABLES:
        raise ConfigError(
            f"target {target!r} is not one of {', '.join(TARGET_TABLES)}", code="INVALID_OPTION"
        )
    if not is_whole(chunk_size) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be a whole number, at least 1, got {chunk_size!r}", code="INVALID_OPTION")
    if max_chunks is not None and (not is_whole(max_chunks) or max_chunks < 1):
        raise ConfigError(f"max_chunks must be a whole number, at least 1, got {max_chunks!r}", code="INVALID_OPTION")
    RateLimiter(rate)  # checks the rate now, before anything is read or written
    if redrive_id is None:
        if selection is None:
            raise ConfigError("resuming needs a redrive id", code="INVALID_OPTION")
        redrive_id = default_redrive_id(
            selection, target=target, reset_reconsume_times=reset_reconsume_times
        )
        if force:
            redrive_id = f"{redrive_id}-{uuid.uuid4().hex[:8]}"
    elif not isinstance(redrive_id, str) or not REDRIVE_ID.fullmatch(redrive_id):
        raise ConfigError(
            f"redrive id {redrive_id!r} must be {REDRIVE_ID.pattern} (whole)", code="INVALID_OPTION"
        )
    operator = operator or whoami()
    audit_path = config.table_path(AUDIT_TABLE)

    def plan_now(exclude: set[str]) -> _Plan:
        return _plan(
            config,
            selection,
            redrive_id=redrive_id,
            target=target,
            reset=reset_reconsume_times,
            force=force,
            chunk_size=chunk_size,
            operator=operator,
            note=note,
            exclude=exclude,
            dlq_version=dlq_version,
        )

    if dry_run:
        plan = plan_now(set())
        limit = len(plan.chunks) if max_chunks is None else min(max_chunks, len(plan.chunks))
        chunks = plan.chunks[:limit]
        table = (
            pa.concat_tables([c for c, _ in chunks])
            if chunks
            else REDRIVE_AUDIT.arrow_schema.empty_table()
        )
        resumed = sum(c.num_rows for c, was_pending in chunks if was_pending)
        log.debug(  # the report says it; the CLI plans this way before it asks, too
            "re-drive %s dry run: %d would move (%d resumed), %d skipped",
            redrive_id,
            table.num_rows,
            resumed,
            plan.skipped,
        )
        return RedriveReport(
            redrive_id=redrive_id,
            target=target,
            dry_run=True,
            matched=plan.matched,
            skipped=plan.skipped,
            resolved=plan.resolved,
            resumed=resumed,
            moved=0,
            remaining=plan.total - table.num_rows,
            plan=table.to_pandas(),
            dlq_version=plan.dlq_version,
        )

    # Other processes see the run in the tasks table, and can cancel it there (redrive_tasks).
    tracker = RunTracker(
        config,
        redrive_id,
        operator=operator,
        target=target,
        selection=None if selection is None else selection.describe(),
    )
    # Chunks this run handled (claimed, or resumed), over every look at the audit table.
    done: list[pa.Table] = []
    done_ids: set[str] = set()
    moved = resumed = 0
    # The rate limit's waits look for a cancel too, so a slow re-drive stops within seconds.
    limiter = RateLimiter(rate, sleep=lambda seconds: tracker.wait(seconds, moved))
    lost = 0  # claims lost in a row, with nothing handled in between

    def report(*, remaining: int, cancelled: str | None = None) -> RedriveReport:
        """The report of this run: what the last plan matched and what this run handled."""
        table = pa.concat_tables(done) if done else REDRIVE_AUDIT.arrow_schema.empty_table()
        return RedriveReport(
            redrive_id=redrive_id,
            target=target,
            dry_run=False,
            matched=plan.matched,
            skipped=plan.skipped,
            resolved=plan.resolved,
            resumed=resumed,
            moved=moved,
            remaining=remaining,
            plan=table.to_pandas(),
            cancelled=cancelled,
            dlq_version=plan.dlq_version,
        )
    try:
        while True:
            plan = plan_now(done_ids)
            budget = (
                len(plan.chunks)
                if max_chunks is None
                else max(min(max_chunks - len(done), len(plan.chunks)), 0)
            )
            expect = plan.audit_version
            if expect is None and any(not was_pending for _, was_pending in plan.chunks[:budget]):
                # Claims are commits against a checked audit version: create the table (only now,
                # so a re-drive that moves nothing leaves no trace), then look again.
                ensure_table(audit_path, REDRIVE_AUDIT.arrow_schema, add_missing=True)
                continue
            if not tracker.started and budget:
                tracker.start(moved=plan.moved_before, total=plan.moved_before + plan.total)
            by_id = _dead_letters(config, plan, [c for c, _ in plan.chunks[:budget]])
            fit = _target_fit(config, target)
            handled_before = len(done)
            try:
                for chunk, was_pending in plan.chunks[:budget]:
                    # A cancel stops the run here, between chunks: what moved stays moved, nothing else is claimed.
                    tracker.check_cancel()
                    k = int(chunk.column("chunk")[0].as_py())
                    # Before the claim: a chunk the target cannot take (a missing dead letter, a table
                    # of other columns) is never claimed, so it holds no dead letter from other commands.
                    rows = fit(_messages(config, chunk, by_id, target=target))
                    if not was_pending:
                        if expect is None or not append_arrow(
                            audit_path,
                            chunk,
                            app_id=app_id(redrive_id),
                            txn_version=k,
                            expect_version=expect,
                        ):
                            raise ConcurrentWriteError(
                                f"{audit_path}: chunk {k} of re-drive {redrive_id} was claimed meanwhile"
                            )
                        expect += 1
                        _report(
                            on_progress,
                            ChunkProgress(
                                redrive_id, k, "planned", chunk.num_rows, moved, plan.total
                            ),
                        )
                    done.append(chunk)
                    done_ids.update(chunk.column("dlq_msg_id").to_pylist())
                    written = _move(config, chunk, rows, redrive_id=redrive_id, target=target)
                    if written:
                        moved += chunk.num_rows
                        resumed += chunk.num_rows if was_pending else 0
                    log.info(
                        "re-drive %s chunk %d: %d messages %s %s (%d/%d)",
                        redrive_id,
                        k,
                        chunk.num_rows,
                        "moved to" if written else "were already in",
                        TARGET_TABLES[target],
                        moved,
                        plan.total,
                    )
                    _report(
                        on_progress,
                        ChunkProgress(redrive_id, k, "moved", chunk.num_rows, moved, plan.total),
                    )
                    tracker.alive(plan.moved_before + moved)
                    limiter.after(chunk.num_rows)
            except ConcurrentWriteError as exc:
                # Another re-drive (or another run of this one) claimed dead letters since this plan
                # was made: plan again from the new audit version. Every lost claim means someone
                # else made progress, so only a storm of re-drives exhausts the attempts.
                lost = 0 if len(done) > handled_before else lost + 1
                if lost >= MAX_CLAIM_ATTEMPTS:
                    raise RedriveError(
                        f"re-drive {redrive_id}: other re-drives claimed dead letters first {lost} times in a row; "
                        f"{moved} messages moved so far; run it again to go on",
                        code="REDRIVE_CONTENDED",
                    ) from exc
                log.info(
                    "re-drive %s: the audit table changed while claiming: %s; planning again",
                    redrive_id,
                    exc,
                )
                continue
            tracker.end("finished", moved=plan.moved_before + moved)
            return report(remaining=plan.total - sum(c.num_rows for c, _ in plan.chunks[:budget]))
    except Cancelled as cancelled:
        tracker.end("cancelled", moved=plan.moved_before + moved, detail=str(cancelled))
        log.warning("re-drive %s stopped after %d messages: %s", redrive_id, moved, cancelled)
        return report(
            remaining=plan.total - sum(c.num_rows for c in done[handled_before:]),
            cancelled=str(cancelled),
        )
    except BaseException as exc:
        # Ctrl-C, a crash of the caller's progress callback, a storage error: the run is interrupted
        # (a re-run resumes it); say so in the tasks table instead of leaving it "running".
        tracker.end("stopped", moved=moved, detail=f"{type(exc).__name__}: {exc}")
        raise


def _plan(
    config: EngineConfig,
    selection: Selection | None,
    *,
    redrive_id: str,
    target: Target,
    reset: bool,
    force: bool,
    chunk_size: int,
    operator: str,
    note: str | None,
    exclude: set[str],
    dlq_version: int | None = None,
) -> _Plan:
    """Read the audit table (and its version) and the DLQ (at ``dlq_version``, default the latest);
    decide the chunks to move.

    ``exclude``: dead letters this run already handled (not counted as skipped).
    """
    snapshot = audit_snapshot(config)
    audit = snapshot.rows
    mine = audit.filter(pc.equal(audit.column("redrive_id"), redrive_id))
    _check_same_redrive(mine, redrive_id, target=target, reset=reset)
    pending = mine.filter(pc.invert(mine.column(MOVED)))
    # Bodies only of the dead letters being moved (_dead_letters): a DLQ of months does not have to
    # fit in memory for a re-drive of a few of its messages.
    dlq_at = table_version(config.table_path("dlq"))
    if dlq_version is not None:
        if not is_whole(dlq_version) or dlq_at is None or not 0 <= dlq_version <= dlq_at:
            raise ConfigError(
                f"dlq_version must be a version of the DLQ, 0 to {dlq_at}, got {dlq_version!r}", code="INVALID_OPTION"
            )
        dlq_at = dlq_version
    # Of the DLQ, the light columns of the dead letters the selection matches, read from the files its
    # group and time bounds may be in. No DLQ when the plan looked: nothing to plan, even if one
    # appears before the read. selection=None (resume): nothing new is planned, only pending chunks move.
    matched = (
        read_dlq(config, selection, version=dlq_at, columns=LIGHT_COLUMNS)
        if dlq_at is not None and selection is not None
        else pa.schema([DLQ.arrow_schema.field(c) for c in LIGHT_COLUMNS]).empty_table()
    )

    # What is left to plan: matched, not in this re-drive, not resolved (ever), and not moved by
    # another re-drive (unless forced). Resolutions are claims in this same table, so a resolve
    # committed after this plan's audit version makes this re-drive's claim fail and plan again.
    seen_here = set(mine.column("dlq_msg_id").to_pylist())
    resolved = set(resolution_rows(audit).column("dlq_msg_id").to_pylist())
    others = redrive_rows(audit).filter(
        pc.not_equal(redrive_rows(audit).column("redrive_id"), redrive_id)
    )
    moved_elsewhere = set(others.filter(others.column(MOVED)).column("dlq_msg_id").to_pylist())
    unfinished = others.filter(pc.invert(others.column(MOVED)))
    unfinished_ids = dict(
        zip(
            unfinished.column("dlq_msg_id").to_pylist(),
            unfinished.column("redrive_id").to_pylist(),
            strict=True,
        )
    )
    ids = matched.column("msg_id").to_pylist()
    clash = sorted(
        {
            unfinished_ids[i]
            for i in ids
            if i in unfinished_ids and i not in seen_here and i not in resolved
        }
    )
    if clash:
        raise RedriveError(
            f"{sum(1 for i in ids if i in unfinished_ids)} selected dead letters belong to unfinished re-drive(s) "
            f"{', '.join(clash)}; finish them first (retry-engine dlq redrive --resume {clash[0]})",
            code="REDRIVE_UNFINISHED",
        )
    fresh_mask = [
        i not in seen_here and i not in resolved and (force or i not in moved_elsewhere)
        for i in ids
    ]
    fresh = matched.filter(pa.array(fresh_mask, pa.bool_())).sort_by(
        [("dead_lettered_at", "ascending"), ("msg_id", "ascending")]
    )
    pending_ids = set(pending.column("dlq_msg_id").to_pylist())
    skipped = sum(
        1
        for i, planned in zip(ids, fresh_mask, strict=True)
        if not planned and i not in pending_ids and i not in exclude and i not in resolved
    )

    generations = _generations(redrive_rows(audit))
    now = _now()
    first_chunk = (max(mine.column("chunk").to_pylist()) + 1) if mine.num_rows else 0
    new_chunks = [
        _plan_chunk(
            fresh.slice(start, chunk_size),
            chunk=first_chunk + n,
            redrive_id=redrive_id,
            target=target,
            reset=reset,
            selection=None if selection is None else selection.describe(),
            operator=operator,
            note=note,
            generations=generations,
            now=now,
        )
        for n, start in enumerate(range(0, fresh.num_rows, chunk_size))
    ]
    resumed_chunks = [
        pending.filter(pc.equal(pending.column("chunk"), k)).select(REDRIVE_AUDIT.names)
        for k in sorted(set(pending.column("chunk").to_pylist()))
    ]
    chunks = [(c, True) for c in resumed_chunks] + [(c, False) for c in new_chunks]
    return _Plan(
        chunks=chunks,
        audit_version=snapshot.version,
        matched=matched.num_rows,
        skipped=skipped,
        resolved=sum(1 for i in ids if i in resolved and i not in seen_here),
        total=sum(c.num_rows for c, _ in chunks),
        matched_rows=matched,
        dlq_version=dlq_at,
        moved_before=mine.num_rows - pending.num_rows,
    )


def _move(
    config: EngineConfig,
    chunk: pa.Table,
    rows: pa.Table,
    *,
    redrive_id: str,
    target: Target,
) -> bool:
    """Append one claimed chunk's messages ``rows`` to the target table; False if it was already there.

    Idempotent under the transaction ``(redrive:<id>, chunk)``: another run of
    the same re-drive moving the same chunk at the same time leaves one copy
    (both build it from the same audit rows, so the ids agree).
    """
    schema = MESSAGES if target == "topic" else RETRY
    return append_arrow(
        config.table_path(TARGET_TABLES[target]),
        rows,
        app_id=app_id(redrive_id),
        txn_version=int(chunk.column("chunk")[0].as_py()),
        partition_by=schema.partition_by,
    )


def _target_fit(config: EngineConfig, target: Target) -> Callable[[pa.Table], pa.Table]:
    """What makes a chunk's messages the rows the target table takes, checked: a nullable column its
    writers added (a producer's trace id) null, as Delta's append leaves a column the data lacks; a
    table that cannot take them (another type, a NOT NULL column, other partitions) raises the
    append's own error. No table yet: the append creates it."""
    path = config.table_path(TARGET_TABLES[target])
    table = open_table(path)
    if table is None:
        return lambda rows: rows
    have = table_arrow_schema(table)
    partition_by = (MESSAGES if target == "topic" else RETRY).partition_by

    def fit(rows: pa.Table) -> pa.Table:
        for f in have:
            if f.name not in rows.column_names and f.nullable:
                rows = rows.append_column(f, pa.nulls(rows.num_rows, f.type))
        check_append(path, table, rows.schema, partition_by)
        return rows.select(have.names)

    return fit


def resume(
    config: EngineConfig,
    redrive_id: str,
    *,
    max_chunks: int | None = None,
    rate: float | None = None,
    dry_run: bool = False,
    on_progress: Callable[[ChunkProgress], None] | None = None,
) -> RedriveReport:
    """Finish the interrupted chunks of ``redrive_id`` without planning new ones."""
    audit = read_audit(config)
    mine = audit.filter(pc.equal(audit.column("redrive_id"), redrive_id))
    if mine.num_rows == 0:
        known = sorted(set(audit.column("redrive_id").to_pylist()))
        raise RedriveError(
            f"no re-drive {redrive_id!r} in the audit table; known: {', '.join(known) or 'none'}",
            code="REDRIVE_NOT_FOUND",
        )
    first = mine.slice(0, 1).to_pylist()[0]
    return _redrive(
        config,
        None,
        target=first["target"],
        reset_reconsume_times=first["reset_reconsume_times"],
        dry_run=dry_run,
        chunk_size=DEFAULT_CHUNK_SIZE,
        rate=rate,
        max_chunks=max_chunks,
        force=False,
        redrive_id=redrive_id,
        operator=first["operator"],
        note=first["note"],
        on_progress=on_progress,
    )


def _report(on_progress: Callable[[ChunkProgress], None] | None, progress: ChunkProgress) -> None:
    if on_progress is not None:
        on_progress(progress)


def _check_same_redrive(mine: pa.Table, redrive_id: str, *, target: Target, reset: bool) -> None:
    if mine.num_rows == 0:
        return
    first = mine.slice(0, 1).to_pylist()[0]
    if first["target"] != target or first["reset_reconsume_times"] != reset:
        raise RedriveError(
            f"re-drive {redrive_id} was started with target={first['target']}, "
            f"reset_reconsume_times={first['reset_reconsume_times']}; got target={target}, "
            f"reset_reconsume_times={reset} (use another --redrive-id)",
            code="REDRIVE_CONFLICT",
        )


def _generations(audit: pa.Table) -> dict[str, int]:
    counts: dict[str, int] = {}
    for msg_id in audit.column("dlq_msg_id").to_pylist():
        counts[msg_id] = counts.get(msg_id, 0) + 1
    return counts


def _plan_chunk(
    rows: pa.Table,
    *,
    chunk: int,
    redrive_id: str,
    target: Target,
    reset: bool,
    selection: str | None,
    operator: str,
    note: str | None,
    generations: dict[str, int],
    now: dt.datetime,
) -> pa.Table:
    """The audit rows of one chunk: the full intent, enough to redo the move after a crash."""
    planned = []
    needed = [
        "consumer_group",
        "retry_topic",
        "msg_id",
        "origin_msg_id",
        "reason_code",
        "reconsume_times",
    ]
    for row in rows.select(needed).to_pylist():
        group = row["consumer_group"]
        if target != "topic" and named_like_a_topic(str(group)):
            # Its retry topic would be %RETRY%%RETRY%x, which no Consumer subscribes (the engine quarantines
            # such a group): the moved messages would be delivered to nobody.
            raise RedriveError(
                f"dead letter {row['msg_id']} is of group {group!r}, named like a retry or dead-letter topic: no "
                "consumer reads its retry topic; re-drive it with --to topic (its original topic), or resolve it",
                code="INVALID_GROUP_NAME",
            )
        planned.append(
            {
                "redrive_id": redrive_id,
                "chunk": chunk,
                "operator": operator,
                "note": note,
                "selection": selection,
                "target": target,
                "reset_reconsume_times": reset,
                "consumer_group": group,
                "retry_topic": row["retry_topic"],
                "dlq_msg_id": row["msg_id"],
                "origin_msg_id": row["origin_msg_id"],
                "reason_code": row["reason_code"],
                "redriven_msg_id": redriven_msg_id(
                    redrive_id, row["msg_id"], generations.get(row["msg_id"], 0)
                ),
                "topic": row["retry_topic"] if target == "topic" else retry_topic(group),
                "target_table": TARGET_TABLES[target],
                "reconsume_times": 0 if reset else row["reconsume_times"],
                "redriven_at": now,
            }
        )
    return pa.Table.from_pylist(planned, schema=REDRIVE_AUDIT.arrow_schema)


def _dead_letters(config: EngineConfig, plan: _Plan, chunks: list[pa.Table]) -> dict[str, dict[str, Any]]:
    """The dead letters ``chunks`` name, every column, by msg id (as the plan's DLQ version holds them):
    one read of the files they may be in, keeping only their rows."""
    if not chunks:
        return {}
    needed = pa.concat_tables([c.select(["dlq_msg_id", "consumer_group"]) for c in chunks])
    known = plan.matched_rows.filter(pc.is_in(plan.matched_rows.column("msg_id"), needed.column("dlq_msg_id").combine_chunks()))
    # Chunks claimed by an earlier run that this plan's selection did not match (a resume plans
    # none): found by their audit rows' group alone, without the time that prunes the others' files.
    rest = needed.filter(pc.invert(pc.is_in(needed.column("dlq_msg_id"), known.column("msg_id").combine_chunks())))
    unknown = pa.table(
        {
            "msg_id": rest.column("dlq_msg_id"),
            "consumer_group": rest.column("consumer_group"),
            "dead_lettered_at": pa.nulls(rest.num_rows, DLQ["dead_lettered_at"].type),
        }
    )
    rows = [
        *dead_letters_named(config, known, version=plan.dlq_version).to_pylist(),
        *dead_letters_named(config, unknown, version=plan.dlq_version).to_pylist(),
    ]
    return {row["msg_id"]: row for row in rows}


def _messages(
    config: EngineConfig, chunk: pa.Table, dlq: dict[str, dict[str, Any]], *, target: Target
) -> pa.Table:
    """The new messages of one chunk, built from its audit rows and the dead letters."""
    now = _now()
    out = []
    for intent in chunk.to_pylist():
        dead = dlq.get(intent["dlq_msg_id"])
        if dead is None:
            raise RedriveError(
                f"dead letter {intent['dlq_msg_id']} of re-drive {intent['redrive_id']} is no longer in the DLQ "
                "(was the table vacuumed or rewritten?)",
                code="DEAD_LETTER_MISSING",
            )
        props = dict(dead["properties"] or [])
        props[PROP_REDRIVE_ID] = intent["redrive_id"]
        props[PROP_REDRIVE_FROM] = intent["dlq_msg_id"]
        props[PROP_REDRIVE_COUNT] = str(redrive_count(props) + 1)
        new_id = intent["redriven_msg_id"]
        if target == "topic" and (problem := name_problem(intent["topic"], kind="topic", max_length=TOPIC_MAX_LENGTH)):
            # A dead letter an earlier release or another writer stored with a bad original topic.
            raise RedriveError(
                f"dead letter {intent['dlq_msg_id']} cannot go back to its original topic: {problem}; re-drive it "
                "with --to retry (its group's retry topic), or resolve it",
                code="INVALID_TOPIC_NAME",
            )
        if target == RESEND_TARGET:
            props[PROP_RESEND_TO] = _resend_instance(intent)
            props[PROP_RESEND_MSG_ID] = new_id
        message = {
            "msg_id": new_id,
            "topic": intent["topic"],
            **{
                k: dead[k]
                for k in (
                    "tags",
                    "keys",
                    "body",
                    "flag",
                    "born_timestamp",
                    "born_host",
                    "origin_msg_id",
                    "retry_topic",
                    "attempts",
                )
            },
            "properties": list(props.items()),
            "store_timestamp": now,
            "reconsume_times": intent["reconsume_times"],
        }
        if target == "topic":
            # The queue the message first came from is not kept on a dead letter.
            out.append({**message, "queue_id": 0})
            continue
        group_config = config.group(intent["consumer_group"])
        queues = max(group_config.retry_queue_nums, 1) if group_config is not None else 1
        out.append(
            {
                **message,
                "queue_id": int(new_id[:8], 16) % queues,
                "consumer_group": intent["consumer_group"],
                "scheduled_at": now,
                "due_at": now,
                "delivered_at": now,
                "error_class": dead["error_class"],
                "error_message": dead["error_message"],
                "delivery_key": delivery_key(
                    dead["origin_msg_id"], intent["reconsume_times"], redrive_count(props)
                ),
            }
        )
    schema = MESSAGES if target == "topic" else RETRY
    return pa.Table.from_pylist(out, schema=schema.arrow_schema)


def _resend_instance(intent: dict[str, Any]) -> str:
    """The consumer instance a resend's audit row names (in its selection, see retry_engine.ops.resend)."""
    instance = selection_consumer(intent["selection"])
    if instance is None:
        raise RedriveError(
            f"audit row of resend {intent['redrive_id']} names no consumer instance in its selection "
            f"{intent['selection']!r}; was the audit table edited?",
            code="RESEND_WITHOUT_CONSUMER",
        )
    return instance


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def whoami() -> str:
    """The OS user name, recorded as the operator when none is given."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        return "unknown"
