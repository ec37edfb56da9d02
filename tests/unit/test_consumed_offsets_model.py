"""A model of a CLUSTERING group over one topic, driven by random churn: no published offset is false,
and no row is lost (#14: consumer offsets; R2/R3, B1).

The real planning (``plan_assignment``, ``credible``, ``best_offsets``) runs; what Spark and the
tables do around it is modelled in a few lines each, as the consumer does it:

* the topic's table grows by commits of rows in 4 queues; an instance's stream delivers the
  commits after its end, up to a version at most the latest (a stream may lag);
* a batch plans (with the group's published offsets when it gains queues), records its plan,
  consumes the stream's rows of its owned queues and, for a gained queue, the rows after the
  catch-up's published offset through the plan's version that have no result yet, then
  commits; an instance publishes its ``consumed_through`` after a commit (or skips, as the
  interval throttle does);
* churn: instances start with a new checkpoint (their stream starts after the group's offsets
  when every queue has one, as ``group_starts``), crash between the record and the commit (the
  replay uses the record and the same stream end, as Spark's offsets log), leave, restart.

After every step every published offset must be true (each row of the queue through it has a
result); at the end, with one instance left running until it caught up, every row has one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from retry_engine.clients.rebalance import (
    Assignment,
    TopicOffsets,
    best_offsets,
    credible,
    plan_assignment,
)

TOPIC = "t"
QUEUES = 4
KEY = TopicOffsets("table", QUEUES, None, {})


@dataclass
class Instance:
    name: str
    records: dict[int, Assignment] = field(default_factory=dict)
    stream_end: int = 0
    next_batch: int = 0
    pending_end: int | None = None
    """A batch planned and recorded but not committed (a crash): its replay reads to the same end."""
    running: bool = False
    planned_since_start: bool = False
    published: dict[int, int] = field(default_factory=dict)


@dataclass
class Group:
    rows: list[tuple[int, int]] = field(default_factory=list)
    """(version, queue) of each row; its index is its id."""
    version: int = 0
    consumed: set[int] = field(default_factory=set)
    instances: dict[str, Instance] = field(default_factory=dict)

    def commit(self, queues: list[int]) -> None:
        self.version += 1
        self.rows += [(self.version, q) for q in queues]

    def members(self) -> list[str]:
        return sorted(name for name, i in self.instances.items() if i.running)

    def published(self) -> dict[str, dict[int, int]]:
        claims = [{TOPIC: TopicOffsets("table", QUEUES, None, dict(i.published))} for i in self.instances.values() if i.published]
        return best_offsets(claims, {TOPIC: KEY})

    def start(self, name: str, *, new_checkpoint: bool) -> None:
        instance = self.instances.get(name)
        if instance is None or new_checkpoint:
            published = self.published().get(TOPIC, {})
            bounds = [published.get(q) for q in range(QUEUES)]
            # group_starts: after the lowest offset of every queue (none past the latest), never past the latest.
            start = min(min(b for b in bounds if b is not None) + 1, self.version) if all(
                b is not None and b <= self.version for b in bounds) else 0
            old = instance.published if instance is not None else {}
            instance = self.instances[name] = Instance(name, stream_end=max(start - 1, 0), published=old)
        instance.running, instance.planned_since_start = True, False

    def batch(self, name: str, advance: int, crash: bool, publish: bool) -> None:
        instance = self.instances[name]
        batch_id = instance.next_batch
        recorded = instance.records.get(batch_id) if instance.pending_end is not None else None
        end = instance.pending_end if instance.pending_end is not None else min(instance.stream_end + advance, self.version)
        if recorded is not None:
            plan = recorded
        else:
            previous = instance.records.get(batch_id - 1)
            kwargs = dict(
                batch_id=batch_id, members=self.members(), me=name, queue_counts={TOPIC: QUEUES},
                versions={TOPIC: self.version}, previous=previous,
                carried_windows=previous.windows if previous is not None else (),
                restarted=not instance.planned_since_start, stream_through={TOPIC: end},
            )
            plan = plan_assignment(**kwargs)  # type: ignore[arg-type]
            if plan.catch_up:
                plan = plan_assignment(**kwargs, published=credible(self.published(), {TOPIC: self.version},
                                                                    {TOPIC: self.version}))  # type: ignore[arg-type]
            instance.records[batch_id] = plan
        instance.planned_since_start = True
        if crash:  # recorded, not committed: the process dies; its replay reads to the same end
            instance.pending_end, instance.running = end, False
            return
        owned = set(plan.owned.get(TOPIC, ()))
        gained = set(plan.catch_up.get(TOPIC, ()))
        after = plan.catch_up_after.get(TOPIC, 0)
        through = plan.catch_up_versions.get(TOPIC, 0)
        for row, (version, queue) in enumerate(self.rows):
            streamed = instance.stream_end < version <= end and queue in owned
            caught = queue in gained and after < version <= through
            if streamed or caught:
                self.consumed.add(row)
        instance.stream_end, instance.pending_end, instance.next_batch = end, None, batch_id + 1
        if publish and plan.consumed_through.get(TOPIC):
            instance.published = dict(plan.consumed_through[TOPIC])

    def check_offsets(self) -> None:
        for instance in self.instances.values():
            for queue, through in instance.published.items():
                missing = [r for r, (v, q) in enumerate(self.rows) if q == queue and v <= through and r not in self.consumed]
                assert not missing, f"{instance.name} vouches queue {queue} through {through}; rows {missing} have no result"


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.randoms(use_true_random=False))
def test_no_published_offset_is_false_and_no_row_is_lost(rng: random.Random) -> None:
    group = Group()
    group.start("A", new_checkpoint=True)
    for _ in range(80):
        roll = rng.random()
        name = rng.choice("ABC")
        instance = group.instances.get(name)
        if roll < 0.3:
            group.commit([rng.randrange(QUEUES) for _ in range(rng.randint(1, 4))])
        elif roll < 0.75:
            if instance is not None and instance.running:
                crash = rng.random() < 0.15 and len(group.members()) > 1
                group.batch(name, rng.randint(0, 3), crash, rng.random() < 0.7)
        elif roll < 0.9:
            if instance is None or not instance.running:
                group.start(name, new_checkpoint=rng.random() < 0.4)
        elif name in group.members() and len(group.members()) > 1:
            instance.running = False  # type: ignore[union-attr]  # leaves
        group.check_offsets()
    # The churn ends: one instance runs until its stream has every commit and it owns every queue.
    for member in group.members():
        group.instances[member].running = False
    last = sorted(group.instances)[0]
    group.start(last, new_checkpoint=False)
    for _ in range(3):
        group.batch(last, group.version, False, True)
        group.check_offsets()
    lost = [r for r in range(len(group.rows)) if r not in group.consumed]
    assert not lost, f"rows {lost} of {group.rows} were never consumed"
