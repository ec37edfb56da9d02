"""Resend one dead letter to one consumer instance, as RocketMQ's dashboard does (``dlq resend``).

RocketMQ's console lets an operator pick a dead letter and a client id of
the group and have that one client consume the message directly. Here the
dead letter is written to the retry table as a ``%RETRY%G`` row marked with
properties ``RESEND_TO_CONSUMER`` (the instance, ``consumer_id@instance_name``)
and ``RESEND_MSG_ID`` (the row's own id): the group's consumers
(:mod:`retry_engine.clients.consumer`) deliver that row only on that instance,
whichever instance owns its queue. If the instance fails it, the engine
retries it as usual; the retry has a new id, so it goes to the whole group.

It is a re-drive of one message with target ``consumer`` (see
:mod:`retry_engine.ops.redrive`): audited in ``redrive_audit`` (the selection
JSON names the instance), moved at most once (running the same resend again
moves nothing), and a dead letter another re-drive or resend moved is
skipped unless ``force``. The instance must be live (a heartbeat younger
than the expiry) when the resend is made: a message for an instance that is
gone would never be delivered.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from retry_engine.clients.dlq import Selection, deliveries_of, read_dlq
from retry_engine.clients.rebalance import (
    DEFAULT_HEARTBEAT_EXPIRY_SECONDS,
    Heartbeat,
    Membership,
    validate_member_id,
)
from retry_engine.config import EngineConfig
from retry_engine.errors import SelectionError, SubscriptionError
from retry_engine.ops import redrive

log = logging.getLogger(__name__)

# The member id the resend command reads heartbeats as (it never beats itself).
_READER = "dlq-resend"


@dataclass(frozen=True, kw_only=True)
class ResendSelection(Selection):
    """One dead letter for one consumer instance: :meth:`describe` (the audit's selection) names it."""

    consumer_id: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_member_id(self.consumer_id, what="consumer_id")


@dataclass(frozen=True)
class ResendReport:
    """What a resend did (or, for a dry run, would do)."""

    dlq_msg_id: str
    consumer_group: str
    instance: str
    """The consumer instance (``consumer_id@instance_name``) the message is for."""
    redrive: redrive.RedriveReport

    @property
    def resent_msg_id(self) -> str | None:
        """Id of the %RETRY%G row written (or that would be); None when nothing moves."""
        plan = self.redrive.plan
        return None if plan.empty else str(plan["redriven_msg_id"].iloc[0])


def resolve_instance(heartbeats: Sequence[Heartbeat], consumer_id: str, *, group: str, now: dt.datetime, expiry_seconds: float) -> str:
    """The live instance ``consumer_id`` names among a group's heartbeats (pure).

    ``consumer_id`` is an instance's full id (``consumer_id@instance_name``)
    or its ``consumer_id`` alone (what ``dlq show`` and the consume results
    show), which must then name exactly one live instance. Raises
    :class:`SubscriptionError` naming the live instances otherwise.
    """
    validate_member_id(consumer_id, what="consumer_id")
    oldest = now - dt.timedelta(seconds=expiry_seconds)
    live = sorted({b.member for b in heartbeats if b.at >= oldest})
    if consumer_id in live:
        return consumer_id
    matches = [m for m in live if m.startswith(consumer_id + "@")]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise SubscriptionError(
            f"consumer_id {consumer_id!r} names {len(matches)} live instances of group {group!r}: "
            f"{', '.join(matches)}; give one of them in full",
            code="RESEND_CONSUMER_AMBIGUOUS",
        )
    raise SubscriptionError(
        f"no live instance {consumer_id!r} in group {group!r} (heartbeat in the last {expiry_seconds:g} s); "
        f"live: {', '.join(live) or 'none'}. A resend is delivered only to a running CLUSTERING consumer",
        code="RESEND_CONSUMER_NOT_LIVE",
    )


def find_dead_letter(config: EngineConfig, msg_id: str) -> pa.Table:
    """The one dead letter ``msg_id`` names: its msg_id, its origin id, or (as ``dlq show`` takes) the id
    of any retry or copy of its origin message; :class:`SelectionError` otherwise."""
    found = read_dlq(config, Selection(ids=(msg_id,)))
    if found.num_rows == 0:
        # A retry's id: the dead letter of its origin in its group (another group's dead letter of the
        # same origin is not the one the operator named).
        parts = [read_dlq(config, Selection(ids=(origin,), group=group))
                 for origin, group in deliveries_of(config, msg_id) if origin != msg_id and group is not None]
        found = pa.concat_tables(parts) if parts else found
    if found.num_rows == 0:
        raise SelectionError(
            f"no dead letter of message {msg_id!r} (by its msg_id, its origin id or a retry's id)",
            code="MESSAGE_NOT_FOUND",
        )
    if found.num_rows > 1:
        ids = sorted(found.column("msg_id").to_pylist())
        raise SelectionError(
            f"{msg_id!r} names {found.num_rows} dead letters ({', '.join(ids)}); resend one by its msg_id",
            code="AMBIGUOUS_DEAD_LETTER",
        )
    return found


def resend(
    config: EngineConfig,
    msg_id: str,
    *,
    consumer_id: str,
    reset_reconsume_times: bool = True,
    force: bool = False,
    dry_run: bool = False,
    operator: str | None = None,
    note: str | None = None,
    heartbeat_expiry_seconds: float = DEFAULT_HEARTBEAT_EXPIRY_SECONDS,
    now: dt.datetime | None = None,
) -> ResendReport:
    """Resend the dead letter ``msg_id`` (its id or origin id) to one live instance of its group.

    ``consumer_id``: see :func:`resolve_instance`. The reconsume count is
    reset to 0 unless ``reset_reconsume_times=False``, as for a re-drive.
    Running the same resend again moves nothing (``redrive.moved == 0``,
    ``redrive.skipped == 1``); ``force`` resends a dead letter that was
    moved before, under a new id.
    """
    if not isinstance(msg_id, str) or not msg_id:
        raise SelectionError(f"msg_id must be a non-empty string, got {msg_id!r}", code="INVALID_IDS")
    dead = find_dead_letter(config, msg_id).to_pylist()[0]
    group = dead["consumer_group"]
    members = Membership(config.engine.lake, group, _READER, heartbeat_expiry_seconds)
    instance = resolve_instance(
        members.heartbeats(), consumer_id, group=group, now=now or dt.datetime.now(dt.UTC),
        expiry_seconds=heartbeat_expiry_seconds,
    )
    selection = ResendSelection(group=group, ids=(dead["msg_id"],), consumer_id=instance)
    key = f"{selection.describe()}\0{reset_reconsume_times}"
    resend_id = "rs-" + hashlib.sha1(key.encode()).hexdigest()[:16]
    if force:
        resend_id = f"{resend_id}-{uuid.uuid4().hex[:8]}"
    report = redrive._redrive(  # the re-drive machinery with the one target it does not offer itself
        config,
        selection,
        target=redrive.RESEND_TARGET,
        reset_reconsume_times=reset_reconsume_times,
        dry_run=dry_run,
        chunk_size=1,
        rate=None,
        max_chunks=None,
        force=force,
        redrive_id=resend_id,
        operator=operator,
        note=note,
        on_progress=None,
    )
    log.info("resend %s of dead letter %s to %s of group %s: %d moved", resend_id, dead["msg_id"], instance, group, report.moved)
    return ResendReport(dead["msg_id"], group, instance, report)
