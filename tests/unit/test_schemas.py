from __future__ import annotations

import pydantic
import pytest

from retry_engine.schemas import ALL_TABLES, DLQ, OUTCOMES, QUARANTINE, RETRY, WORK
from tests.builders import Result


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.name)
def test_views_derive_from_one_definition(table) -> None:  # type: ignore[no-untyped-def]
    assert table.spark_schema.fieldNames() == table.arrow_schema.names == table.names
    assert set(table.pydantic_model.model_fields) == set(table.names)
    for name in table.partition_by:
        assert not table[name].nullable, name


def test_engine_outputs_are_projections_of_the_work_rows() -> None:
    for table in (RETRY, DLQ, QUARANTINE, OUTCOMES):
        assert set(table.names) <= set(WORK.names), table.name


def test_pydantic_view_validates_rows() -> None:
    from retry_engine.schemas import CONSUME_RESULTS

    row = CONSUME_RESULTS.pydantic_model(**{**Result.of().values, "properties": {"a": "b"}})
    assert row.consumer_group == "G"  # type: ignore[attr-defined]
    with pytest.raises(pydantic.ValidationError, match="extra"):
        CONSUME_RESULTS.pydantic_model(bogus=1)
