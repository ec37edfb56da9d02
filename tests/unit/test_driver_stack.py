"""The driver JVM's thread stack: the engine's -Xss32m survives the user's own JVM options.

Without it, stopping the engine during a batch overflows the stream thread's stack in Spark's
interruption check (a backtracking regex over the Py4J error text); a user's
``spark.driver.extraJavaOptions`` in ``engine.spark_conf`` used to replace it.
"""

from __future__ import annotations

import pytest

from retry_engine.delta.session import (
    DRIVER_JAVA_OPTIONS,
    DRIVER_JAVA_OPTIONS_KEY,
    small_stack_warning,
    spark_conf,
    with_stack_size,
)


def test_the_engine_s_own_sessions_get_the_large_stack() -> None:
    assert spark_conf()[DRIVER_JAVA_OPTIONS_KEY] == DRIVER_JAVA_OPTIONS == "-Xss32m"


@pytest.mark.parametrize(
    "theirs",
    [
        "-Dlog4j2.configurationFile=file:/etc/spark/log4j2.properties",
        "-XX:+UseG1GC -Xlog:gc:file=/tmp/gc.log",
        # Other threads' stacks, not the stream thread's.
        "-XX:CompilerThreadStackSize=2048 -XX:VMThreadStackSize=2048",
        "",
        "   ",
    ],
)
def test_a_user_s_driver_options_keep_the_large_stack(theirs: str) -> None:
    options = spark_conf(extra={DRIVER_JAVA_OPTIONS_KEY: theirs})[DRIVER_JAVA_OPTIONS_KEY]
    assert options.split() == [DRIVER_JAVA_OPTIONS, *theirs.split()]


@pytest.mark.parametrize("theirs", ["-Xss64m", "-Dx=1 -Xss8m", "-XX:ThreadStackSize=65536"])
def test_a_user_s_own_stack_size_is_kept_as_it_is(theirs: str) -> None:
    assert spark_conf(extra={DRIVER_JAVA_OPTIONS_KEY: theirs})[DRIVER_JAVA_OPTIONS_KEY] == theirs
    assert with_stack_size(theirs) == theirs


@pytest.mark.parametrize("kib", [None, 16 * 1024, 32 * 1024, 1024 * 1024])
def test_a_large_or_unknown_stack_gets_no_warning(kib: int | None) -> None:
    assert small_stack_warning(kib) is None


@pytest.mark.parametrize(("kib", "said"), [(1024, "1024 KiB"), (16 * 1024 - 1, "16383 KiB"), (0, "the platform's default"),
                                           (-5, "the platform's default")])
def test_a_small_stack_is_named_with_what_to_do(kib: int, said: str) -> None:
    warning = small_stack_warning(kib)
    assert warning is not None and f"thread stack is {said}:" in warning
    assert "StackOverflowError" in warning and "--driver-java-options -Xss32m" in warning
