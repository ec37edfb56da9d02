"""``examples/dlq.ipynb`` runs top to bottom against a small demo lake (#13 part 7).

The lake is made here, fast, without an engine run: eight dead letters in the
DLQ table's own schema (``retry_engine.schemas.DLQ``), written by the engine's
own file writer (its partition folders) over three days, so the notebook has something to
filter, re-drive and plot. The notebook is executed by nbclient in a real
kernel (it starts its own Spark for the SQL part) with the lake passed in
``RETRY_ENGINE_LAKE``; the test then checks its printed results and the
lake itself against counts derived from the rows written here.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import nbformat
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from nbclient import NotebookClient

from retry_engine.schemas import DLQ
from tests.engine_files import append_like_engine

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "dlq.ipynb"
DAY = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)

# (group, topic, error class, hours after DAY): 3 billing timeouts are what the notebook re-drives.
LETTERS = [
    ("billing", "orders", "com.acme.Timeout", 0),
    ("billing", "orders", "com.acme.Timeout", 1),
    ("billing", "orders", "com.acme.Timeout", 25),
    ("billing", "orders", "com.acme.BadJson", 26),
    ("billing", "orders", "com.acme.BadJson", 26),
    ("shipping", "parcels", "java.lang.IllegalStateException", 27),
    ("shipping", "parcels", "java.lang.IllegalStateException", 50),
    ("pay|eu", "payments", "java.net.SocketTimeoutException", 51),
]
BILLING_TIMEOUTS = 3


def _dead_letter(i: int, group: str, topic: str, error_class: str, hours: int) -> dict[str, Any]:
    at = DAY + dt.timedelta(hours=hours)
    return {
        "msg_id": f"DLQ-{i:03d}",
        "topic": f"%DLQ%{group}",
        "tags": "TagA",
        "keys": f"order-{i}",
        "body": f'{{"order": {i}}}'.encode(),
        "flag": 0,
        "properties": [("DLQ_ORIGIN_TOPIC", topic)],
        "born_timestamp": at - dt.timedelta(minutes=30),
        "born_host": "10.0.0.1:5000",
        "store_timestamp": at,
        "queue_id": 0,
        "reconsume_times": 16,
        "origin_msg_id": f"ORIGIN-{i:03d}",
        "retry_topic": topic,
        "attempts": None,
        "consumer_group": group,
        "dead_lettered_at": at,
        "reason_code": "MAX_RECONSUME_TIMES",
        "reason": "reconsume_times 16 >= max 16",
        "error_class": error_class,
        "error_message": f"{error_class}: failed on order {i}",
        "delivery_key": f"ORIGIN-{i:03d}:16",
        "source_result_id": f"R-{i:03d}",
    }


@pytest.fixture
def demo_lake(tmp_path: Path) -> Path:
    lake = tmp_path / "lake"
    rows = [_dead_letter(i, *letter) for i, letter in enumerate(LETTERS)]
    # Two commits with the engine's own file writer, as it writes them batch by batch.
    for part in (rows[:3], rows[3:]):
        append_like_engine(str(lake / "dlq"), pa.Table.from_pylist(part, schema=DLQ.arrow_schema), partition_by=DLQ.partition_by)
    return lake


def _outputs(nb: Any, tag: str) -> str:
    """The text a tagged cell printed or displayed."""
    cell = next(c for c in nb.cells if tag in c.metadata.get("tags", []))
    texts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            texts.append(out.text)
        elif "text/plain" in out.get("data", {}):
            texts.append(out.data["text/plain"])
    return "\n".join(texts)


def test_the_dlq_notebook_runs_and_redrives_the_filtered_set(demo_lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#13 part 7 (SPEC B5, B6): pandas, Polars and Spark SQL count the DLQ alike; dry run, then re-drive; a plot.

    The selection (group billing, errors matching "timeout") matches the
    three billing timeouts only: not the billing BadJson letters, and not
    the SocketTimeoutException of another group.
    """
    monkeypatch.setenv("RETRY_ENGINE_LAKE", str(demo_lake))
    # This lake's billing timeouts (the notebook's own defaults are the demo lake's group and errors).
    monkeypatch.setenv("DLQ_NOTEBOOK_GROUP", "billing")
    monkeypatch.setenv("DLQ_NOTEBOOK_ERROR", "(?i)timeout")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    total = len(LETTERS)
    assert f"{total} dead letters" in _outputs(nb, "pandas")
    assert f"polars total: {total}" in _outputs(nb, "polars")
    assert f"spark sql total: {total}" in _outputs(nb, "spark-sql")
    assert f"dry run: {BILLING_TIMEOUTS} matched, would move {BILLING_TIMEOUTS}, already moved 0" in _outputs(nb, "dry-run")
    redrive_out = _outputs(nb, "redrive")
    assert f"moved {BILLING_TIMEOUTS}, already moved before 0" in redrive_out
    assert "a second run would move 0" in redrive_out
    plot = next(c for c in nb.cells if "plot" in c.metadata.get("tags", []))
    assert any("image/png" in out.get("data", {}) for out in plot.outputs)
    assert f"plotted {total} dead letters" in _outputs(nb, "plot")

    # The lake says the same: three new messages of topic orders, audited, the DLQ unchanged (R9).
    messages = DeltaTable(str(demo_lake / "messages")).to_pyarrow_table().to_pylist()
    assert sorted(m["origin_msg_id"] for m in messages) == ["ORIGIN-000", "ORIGIN-001", "ORIGIN-002"]
    assert {m["topic"] for m in messages} == {"orders"}
    audit = DeltaTable(str(demo_lake / "redrive_audit")).to_pyarrow_table()
    assert audit.num_rows == BILLING_TIMEOUTS
    assert DeltaTable(str(demo_lake / "dlq")).to_pyarrow_table().num_rows == total
