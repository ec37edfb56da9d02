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
