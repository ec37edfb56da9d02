"""What Spark's own Python processes import for the ``deltars`` source (#14 part 3: the first batch).

Spark runs the Python data source's planning in processes of its own: the
streaming source runner (offsets, in every micro-batch) and the planner
workers (the read's partitions, in the first batch), each a fresh interpreter
that only unpickles the source. Whatever they import is paid on the query's
critical path: pandas (0.19 s of CPU) came in through ``pa.table`` on
delta-rs's add actions in the first ``latestOffset``, and the package's
configuration models (pydantic, ~90 ms) through ``retry_engine/__init__``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from retry_engine.delta import append_arrow, ensure_table
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table

# What the streaming source runner does with the unpickled source, in a new interpreter.
RUNNER = """
import json, sys
from pyspark.sql.datasource import ReadAllAvailable
from retry_engine.delta.datasource import DeltaRsDataSource

options = json.loads(sys.argv[1])
source = DeltaRsDataSource(options)
reader = source.streamReader(source.schema())
start = reader.initialOffset()
end = reader.latestOffset(start, ReadAllAvailable())
files = reader.partitions(start, end)
heavy = sorted(name for name in ("pandas", "pydantic", "retry_engine.config") if name in sys.modules)
# The reads run in the worker daemon's processes (pandas is loaded there anyway): only counted.
import pyarrow as pa
payloads = [p for part in files for batch in reader.read(part) for p in batch.column(0).to_pylist()]
rows = sum(pa.ipc.open_stream(p).read_all().num_rows for p in payloads)
print(json.dumps({"files": len(files), "rows": rows, "heavy": heavy}))
"""


def test_the_source_runner_plans_without_pandas_or_the_config_models(tmp_path: Path) -> None:
    path = str(tmp_path / "in")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    append_arrow(path, results_table([Result.of(), Result.of()]))
    append_arrow(path, results_table([Result.of()]))
    options = {"path": path, "sourcePositionColumn": "_pos", "packedColumn": "packed"}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(options)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"files": 2, "rows": 3, "heavy": []}
