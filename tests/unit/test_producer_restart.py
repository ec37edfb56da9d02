"""A producer's duplicate protection across processes (#12 items 12 and 21, R13).

Each producer runs in its own OS process (``multiprocessing``, spawn) on a
real Delta table in a temp folder; no Spark.
"""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter
from pathlib import Path

from deltalake import DeltaTable

from retry_engine.clients.producer import Message, Producer

PRODUCER_ID = "orders-service-1"


def _send_range(path: str, first: int, last: int, barrier: mp.synchronize.Barrier | None, out: mp.Queue[object]) -> None:
    """Send sequences ``first..last`` (body = the sequence) as a fresh producer; report (sequence, ids, written)."""
    try:
        producer = Producer(path, producer_id=PRODUCER_ID, retry_backoff_ms=1)
        sent = []
        for sequence in range(first, last + 1):
            if barrier is not None:
                barrier.wait(timeout=120)
            result = producer.send_batch([Message("orders", f"order-{sequence}".encode())], sequence=sequence)
            sent.append((sequence, result.msg_ids, result.written))
        out.put(sent)
    except BaseException as exc:  # reported to the parent, which fails the test with it
        out.put(repr(exc))
        if barrier is not None:
            barrier.abort()


def _run(*calls: tuple[str, int, int], together: bool) -> list[object]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(calls)) if together else None
    out: mp.Queue[object] = ctx.Queue()
    results = []
    procs = [ctx.Process(target=_send_range, args=(*call, barrier, out)) for call in calls]
    try:
        if together:
            for p in procs:
                p.start()
            results = [out.get(timeout=600) for _ in procs]
        else:
            for p in procs:  # one after the other: the second is the first one restarted
                p.start()
                results.append(out.get(timeout=600))
                p.join(timeout=60)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for r in results:
        assert isinstance(r, list), f"a producer process failed: {r}"
    return results


def _bodies(path: str) -> Counter[bytes]:
    return Counter(DeltaTable(path).to_pyarrow_table().column("body").to_pylist())


def test_restarted_producer_resending_the_same_sequences_writes_each_message_once(tmp_path: Path) -> None:
    """#12 item 21 / R13: a process sends 1..5 and exits; its restart re-sends 1..5 (it does not know
    what landed) and goes on with 6. Each message is in the table once, and the restart gets the
    ids of the copies that are there."""
    path = str(tmp_path / "messages")
    first, restarted = _run((path, 1, 5), (path, 1, 6), together=False)
    assert isinstance(first, list) and isinstance(restarted, list)
    assert [w for _, _, w in first] == [True] * 5
    assert [w for _, _, w in restarted] == [False] * 5 + [True]
    assert [ids for _, ids, _ in restarted[:5]] == [ids for _, ids, _ in first]
    assert _bodies(path) == Counter(f"order-{s}".encode() for s in range(1, 7))
    table = DeltaTable(path).to_pyarrow_table()
    by_body = dict(zip(table.column("body").to_pylist(), table.column("msg_id").to_pylist(), strict=True))
    assert [by_body[f"order-{s}".encode()] for s, _, _ in restarted] == [ids[0] for _, ids, _ in restarted]


def test_two_live_processes_with_one_producer_id_write_each_sequence_once(tmp_path: Path) -> None:
    """#12 items 10/21 / B1: an old and a new instance of one producer (a failover overlap) send the
    same 20 sequences at the same moment: one copy of each, and exactly one of them reports writing it."""
    path = str(tmp_path / "messages")
    a, b = _run((path, 1, 20), (path, 1, 20), together=True)
    assert isinstance(a, list) and isinstance(b, list)
    assert _bodies(path) == Counter(f"order-{s}".encode() for s in range(1, 21))
    for (seq_a, ids_a, wrote_a), (seq_b, ids_b, wrote_b) in zip(a, b, strict=True):
        assert seq_a == seq_b and ids_a == ids_b
        assert wrote_a != wrote_b, f"sequence {seq_a}: written by {'both' if wrote_a else 'neither'}"
