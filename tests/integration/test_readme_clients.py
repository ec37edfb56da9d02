"""The README's producer and consumer examples, run as written (against a temp lake)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

REPO = Path(__file__).resolve().parents[2]


def section_blocks(title: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_readme_producer_and_consumer_examples_run(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRY_ENGINE_LAKE", str(tmp_path))
    monkeypatch.chdir(REPO)
    blocks = section_blocks("Producers and consumers")
    assert len(blocks) == 3
    namespace: dict[str, Any] = {"print": lambda *a: None}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    messages = DeltaTable(str(tmp_path / "messages")).to_pyarrow_table().to_pylist()
    assert sorted(m["body"] for m in messages) == [b"from spark", b'{"order": 42}']
    assert [m["msg_id"] for m in messages if m["tags"] == "created"] == list(namespace["sent"].msg_ids)
    results = {r["body"]: r for r in DeltaTable(str(tmp_path / "consume_results")).to_pyarrow_table().to_pylist()}
    assert results[b'{"order": 42}']["status"] == "RECONSUME_LATER"
    assert results[b'{"order": 42}']["delay_level_when_next_consume"] == 1
    assert results[b"from spark"]["status"] == "CONSUME_SUCCESS"
    assert {r["consumer_group"] for r in results.values()} == {"billing"}


def test_send_frame_rejects_bad_frames_with_clear_errors(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import PythonException

    from retry_engine.clients.producer import send_frame
    from retry_engine.errors import SchemaMismatchError

    path = str(tmp_path / "messages")
    no_body = spark.createDataFrame([("orders",)], "topic string")
    with pytest.raises(SchemaMismatchError, match=r"\[MESSAGE_COLUMNS\] messages DataFrame lacks column 'body'"):
        send_frame(no_body, path)
    extra = spark.createDataFrame([("orders", b"x", 1)], "topic string, body binary, shard int")
    with pytest.raises(SchemaMismatchError, match=r"has unknown column 'shard'"):
        send_frame(extra, path)
    bad_topic = spark.createDataFrame([("no spaces allowed", b"x")], "topic string, body binary")
    with pytest.raises(PythonException, match=r"INVALID_TOPIC_NAME.*'no spaces allowed'"):
        send_frame(bad_topic, path)
    too_big = spark.createDataFrame([("orders", b"x" * 11)], "topic string, body binary")
    with pytest.raises(PythonException, match=r"BODY_TOO_LARGE.*11-byte body; at most 10"):
        send_frame(too_big, path, max_body_bytes=10)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0
    # A write that fails inside send_frame's Arrow byte cap (capped_arrow_batches) gives the session
    # its own value back (that the cap applies is asserted on the consumer's query, test_clients).
    from retry_engine.delta.session import ARROW_MAX_BYTES_KEY, ARROW_MAX_BYTES_NONE

    assert spark.conf.get(ARROW_MAX_BYTES_KEY) == ARROW_MAX_BYTES_NONE
