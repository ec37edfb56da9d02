"""The eight hand mutations of issue #16 that survived the unit tests before it; each must now be killed.

Each is applied to a copy of the package and tests (never to the worktree), its
test run on the copy (which it must fail) and on the clean copy (which it must
pass). mutmut makes small syntactic mutants; these are the semantic ones the
issue lists, one test each. ``make mutation`` runs this after mutmut.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# (what the mutation does, file, text replaced, replacement, the test that must kill it)
MUTATIONS: list[tuple[str, str, str, str, str]] = [
    ("consumer max_reconsume_times may only lower the group's limit", "retry_engine/core/decide.py",
     "        max_times = group.retry_max_times\n", "        max_times = group.retry_max_times\n    else:\n        max_times = min(max_times, group.retry_max_times)\n",
     "tests/unit/test_decide_rows.py::test_r6_a_consumers_max_reconsume_times_replaces_the_groups_even_upwards"),
    ("reconsume_times < 0 check moved to < -1", "retry_engine/core/decide.py",
     "pc.less(reconsume, 0)", "pc.less(reconsume, -1)",
     "tests/unit/test_decide_rows.py::test_bad_input_reconsume_times_minus_one_is_invalid_and_zero_is_not"),
    ("BODY_TOO_LARGE at >= instead of >", "retry_engine/core/decide.py",
     "pc.greater(sizes, limit)", "pc.greater_equal(sizes, limit)",
     "tests/unit/test_decide_rows.py::test_bad_input_a_body_of_exactly_max_body_bytes_is_accepted"),
    ("retry queue_id always 0", "retry_engine/core/decide.py",
     '"queue_id": int(out_id[:8], 16) % group.retry_queue_nums,', '"queue_id": 0,',
     "tests/unit/test_decide_rows.py::test_r3_retries_spread_over_every_retry_queue_of_the_group"),
    ("error message never truncated", "retry_engine/core/decide.py",
     "    if text is None or len(text) <= ERROR_MESSAGE_LIMIT:\n", "    if True:\n",
     "tests/unit/test_decide_rows.py::test_b4_error_messages_are_cut_to_2000_characters"),
    ("non-retryable patterns matched against the message only", "retry_engine/core/decide.py",
     "for text in (error_class, error_message):", "for text in (error_message,):",
     "tests/unit/test_decide_rows.py::test_b3_a_pattern_is_matched_against_the_error_class_too"),
    ("state bucket keyed by consumed_at before store_timestamp", "retry_engine/core/decide.py",
     '        cols["store_timestamp"].take(slow),\n        cols["born_timestamp"].take(slow),\n        cols["consumed_at"].take(slow),\n',
     '        cols["consumed_at"].take(slow),\n        cols["born_timestamp"].take(slow),\n        cols["store_timestamp"].take(slow),\n',
     "tests/unit/test_decide_rows.py::test_r8_the_bucket_is_the_store_time_then_born_then_consumed_then_the_batch_clock"),
    ("exponential backoff initial/max swapped when read from the config file", "retry_engine/config.py",
     "parse_duration_ms(backoff.initial), backoff.multiplier, parse_duration_ms(backoff.max)",
     "parse_duration_ms(backoff.max), backoff.multiplier, parse_duration_ms(backoff.initial)",
     "tests/unit/test_config_rules.py::test_b2_exponential_backoff_from_the_file_starts_at_initial_and_stops_at_max"),
]


def pytest(root: Path, test: str) -> bool:
    """Whether ``test`` passes in the copy at ``root``."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
    return subprocess.run(command, cwd=root, capture_output=True, text=True).returncode == 0


def main() -> int:
    survived = 0
    with tempfile.TemporaryDirectory(prefix="hand-mutations-") as tmp:
        root = Path(tmp)
        for name in ("retry_engine", "tests", "conf", "setup.cfg", "pyproject.toml"):
            source = REPO / name
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / name)
        for what, path, old, new, test in MUTATIONS:
            file = root / path
            text = file.read_text()
            if text.count(old) != 1:
                print(f"{what}: the code to mutate is not found once in {path}; update {Path(__file__).name}")
                survived += 1
                continue
            clean = pytest(root, test)
            file.write_text(text.replace(old, new))
            try:
                killed = not pytest(root, test)
            finally:
                file.write_text(text)
            ok = clean and killed
            survived += not ok
            print(f"{'killed ' if ok else 'SURVIVED' if clean else 'FAILS CLEAN'}  {what}  ({test.split('::')[1]})")
    print(f"hand mutations (#16 item 3): {len(MUTATIONS) - survived}/{len(MUTATIONS)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
