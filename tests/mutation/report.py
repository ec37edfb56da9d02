"""The score of the last ``mutmut run`` and every mutant that survived it (``make mutation``, #16).

Run from the project root after ``mutmut run``. A mutant that survived, or
that no selected test reaches ("no tests"), is *accepted* when its id is in
``tests/mutation/equivalent.txt`` (one line each: ``<id> <function>: why it is
equivalent``); every other one is printed with its diff and fails the run.

An id is a hash of the mutated function and the lines the mutation removes and
adds, so it survives edits elsewhere in the module (mutmut's own names,
``...__mutmut_12``, are renumbered whenever the function changes).

Scores printed: *killed* is killed / all mutants (what mutmut reports); *with
accepted equivalents* leaves the accepted mutants out of the denominator,
since no test can tell them from the original.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

EQUIVALENT_FILE = Path(__file__).with_name("equivalent.txt")
GOAL = 0.90
# mutmut's exit codes by verdict (mutmut.stats.status_by_exit_code): killed, timeout and
# "caught by type check" are kills; 0 survived; 5 and 33 "no tests".
KILLED_CODES = {1, 3, 36, 37, 24, -24, 152, 255}
SURVIVED_CODES = {0}
NO_TEST_CODES = {5, 33}
_ENTRY = re.compile(r"^([0-9a-f]{12})\s+(\S+?):\s+(\S.*)$")


@dataclass(frozen=True)
class Mutant:
    name: str
    function: str
    status: str
    diff: str
    mutant_id: str


def mutant_id(function: str, removed: list[str], added: list[str], occurrence: int) -> str:
    """A stable id: the function, the changed lines (stripped) and which identical change of it this is."""
    text = "\n".join([function, *(f"-{line.strip()}" for line in removed), *(f"+{line.strip()}" for line in added)])
    return hashlib.sha1(f"{text}\n#{occurrence}".encode()).hexdigest()[:12]


def function_of(name: str) -> str:
    """``retry_engine.core.decide.x__decide_valid__mutmut_3`` -> ``retry_engine.core.decide._decide_valid``."""
    base = name.rsplit("__mutmut_", 1)[0]
    module, _, func = base.rpartition(".")
    if func.startswith("xǁ"):  # a method: xǁClassǁmethod
        _, cls, method = func.split("ǁ")
        return f"{module}.{cls}.{method}"
    return f"{module}.{func[2:]}"


def load_equivalents(path: Path = EQUIVALENT_FILE) -> dict[str, str]:
    """``{id: 'function: why'}`` from the accepted-equivalents file (``#`` lines are comments)."""
    accepted: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _ENTRY.match(line)
        if match is None:
            raise SystemExit(f"{path}:{number}: expected '<12 hex id> <function>: <why>', got {line!r}")
        accepted[match.group(1)] = f"{match.group(2)}: {match.group(3)}"
    return accepted


def collect() -> tuple[list[Mutant], Counter[str], dict[str, Counter[str]]]:
    """Every mutant of the last run that was not killed, with its diff; the count of each verdict, in all and by file."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.utils.file_utils import walk_mutatable_files

    counts: Counter[str] = Counter()
    by_file: dict[str, Counter[str]] = {}
    out: list[Mutant] = []
    seen: Counter[tuple[str, str]] = Counter()
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        file_counts = by_file.setdefault(str(path), Counter())
        for name, code in sorted(data.exit_code_by_key.items(), key=lambda kv: _order(kv[0])):
            if code in KILLED_CODES:
                counts["killed"] += 1
                file_counts["killed"] += 1
                continue
            status = "survived" if code in SURVIVED_CODES else "no tests" if code in NO_TEST_CODES else f"exit {code}"
            counts[status] += 1
            file_counts[status] += 1
            diff = get_diff_for_mutant(name, path=path)
            removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
            added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
            function = function_of(name)
            key = (function, "\n".join(line.strip() for line in [*removed, "=>", *added]))
            seen[key] += 1
            out.append(Mutant(name, function, status, diff, mutant_id(function, removed, added, seen[key])))
    return out, counts, by_file


def _order(name: str) -> tuple[str, int]:
    base, _, number = name.rpartition("__mutmut_")
    return base, int(number) if number.isdigit() else 0


def short_diff(diff: str) -> str:
    """The changed lines of a unified diff, without headers and context."""
    return "\n".join(
        line for line in diff.splitlines()
        if line[:1] in "-+" and not line.startswith(("---", "+++"))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--list-accepted", action="store_true", help="also print the accepted mutants' diffs")
    args = parser.parse_args(argv)
    accepted = load_equivalents()
    mutants, counts, by_file = collect()
    total = sum(counts.values())
    if total == 0:
        print("no mutation results under ./mutants: run `mutmut run` first")
        return 2
    open_ = [m for m in mutants if m.mutant_id not in accepted]
    kept = [m for m in mutants if m.mutant_id in accepted]
    unused = sorted(set(accepted) - {m.mutant_id for m in mutants})
    killed = counts["killed"]
    print(f"mutants: {total}  " + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"killed: {killed}/{total} = {killed / total:.1%}")
    effective = total - len(kept)
    print(
        f"with accepted equivalents ({len(kept)}, {EQUIVALENT_FILE.name}) left out: "
        f"{killed}/{effective} = {killed / effective:.1%}"
    )
    for path, file_counts in by_file.items():
        n = sum(file_counts.values())
        accepted_here = sum(1 for m in kept if m.name.startswith(path[:-3].replace("/", ".") + "."))
        print(f"  {path}: {file_counts['killed']}/{n} killed, {n - file_counts['killed']} not ({accepted_here} accepted)")
    if args.list_accepted:
        for m in kept:
            print(f"\n[accepted {m.mutant_id}] {m.name} ({m.status}): {accepted[m.mutant_id]}\n{short_diff(m.diff)}")
    for m in open_:
        print(f"\n[{m.status} {m.mutant_id}] {m.name}\n{short_diff(m.diff)}")
    if unused:
        print(f"\n{len(unused)} accepted id(s) matched no surviving mutant (killed now, or the code changed): "
              + ", ".join(unused))
    if open_:
        print(f"\n{len(open_)} mutant(s) neither killed nor accepted: kill each with a spec-derived test, "
              f"or add '<id> <function>: <why it is equivalent>' to {EQUIVALENT_FILE}")
        return 1
    if killed / total < GOAL:
        print(f"\nkilled {killed / total:.1%} is below the goal of {GOAL:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
