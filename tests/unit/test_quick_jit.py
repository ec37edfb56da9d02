"""The JVM options of the engine's own local sessions: C1 only, unless the user chose (#14 part 3)."""

from __future__ import annotations

import pytest

from retry_engine.delta.session import QUICK_JIT_ENV, QUICK_JIT_OPTION, quick_jit_options


@pytest.fixture(autouse=True)
def _switch_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(QUICK_JIT_ENV, raising=False)


def test_the_engine_s_options_get_the_client_compiler_only() -> None:
    assert quick_jit_options("-Xss32m") == f"-Xss32m {QUICK_JIT_OPTION}"
    assert quick_jit_options("") == QUICK_JIT_OPTION


@pytest.mark.parametrize(
    "theirs",
    [
        "-Xss32m -XX:TieredStopAtLevel=4",
        "-XX:-TieredCompilation",
        "-XX:+TieredCompilation -Xlog:gc",
        "-Xint",
        "-Xss32m -Xcomp",
    ],
)
def test_options_that_choose_how_the_jvm_compiles_are_kept_as_they_are(theirs: str) -> None:
    assert quick_jit_options(theirs) == theirs


@pytest.mark.parametrize("value", ["off", "OFF", " no ", "0", "false"])
def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(QUICK_JIT_ENV, value)
    assert quick_jit_options("-Xss32m") == "-Xss32m"


@pytest.mark.parametrize("value", ["on", "", "yes please", "1"])
def test_any_other_switch_value_leaves_it_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(QUICK_JIT_ENV, value)
    assert quick_jit_options("-Xss32m") == f"-Xss32m {QUICK_JIT_OPTION}"
