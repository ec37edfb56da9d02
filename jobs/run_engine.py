"""Run the retry engine: ``spark-submit jobs/run_engine.py --config conf/retry-engine.toml``.

Also runnable with plain Python (``make run``), which starts local Spark.
"""

from __future__ import annotations

import sys

from retry_engine.ops.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
