"""The wire messages: generated code is current, and core objects survive a round trip."""

from __future__ import annotations

import filecmp
import importlib.util
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import jetstream as js
from jetstream import planwire
from jetstream.control import codec
from jetstream.errors import DataError
from jetstream.v1 import query_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_current(tmp_path: Path) -> None:
    written = _load_generator().generate(tmp_path)
    assert written, "no .proto files found"
    for path in written:
        committed = ROOT / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run scripts/gen_protos.py"
        assert filecmp.cmp(path, committed, shallow=False), (
            f"{committed} is stale: run scripts/gen_protos.py")


SCALARS = st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1),
                    st.floats(allow_nan=False), st.booleans())
RECORDS = st.dictionaries(st.text(min_size=1, max_size=6), SCALARS, max_size=4)
ROWS = st.dictionaries(st.text(min_size=1, max_size=6),
                       st.one_of(SCALARS, st.lists(RECORDS, max_size=3)), max_size=5)


@given(st.lists(ROWS, max_size=4), st.booleans(),
       st.one_of(st.none(), st.floats(0, 1)), st.integers(0, 2**40),
       st.lists(st.text(max_size=20), max_size=2))
def test_window_result_round_trip(rows, exact, bound, start, warnings) -> None:
    # A result's rows share their columns; a row without a value has a NULL there.
    columns = list(dict.fromkeys(c for row in rows for c in row))
    rows = [{c: row.get(c) for c in columns} for row in rows]
    result = js.WindowResult("q", start, start + 10_000, rows, exact, bound,
                             warnings=warnings)
    message = codec.result_to_proto(result)
    decoded = codec.result_from_proto(pb.WindowResult.FromString(message.SerializeToString()))
    assert decoded == result
    assert [list(row) for row in decoded.rows] == [columns] * len(rows)  # in their order


def test_a_distributed_result_from_no_site_says_zero_of_them() -> None:
    """0 of 6 sites (a window whose partitions were not all in) is not "no count at all"."""
    result = js.WindowResult("q", 0, 10_000, [], True, 0.0, sites_reporting=0,
                             sites_expected=6, latency_s=1.5, wan_bytes=0,
                             missing_sites=["a", "b", "c", "d", "e", "f"])
    message = codec.result_to_proto(result)
    assert codec.result_from_proto(pb.WindowResult.FromString(
        message.SerializeToString())) == result


def test_null_columns_are_left_out_and_restored() -> None:
    message = planwire.record_to_proto({"a": 1, "b": None})
    assert set(message.fields) == {"a"}
    assert planwire.record_from_proto(message, ("a", "b")) == {"a": 1, "b": None}


def test_values_that_have_no_wire_form_are_refused() -> None:
    with pytest.raises(DataError, match="cannot encode"):
        planwire.record_to_proto({"a": object()})


def test_slo_to_proto_keeps_unset_fields_unset() -> None:
    message = planwire.slo_to_proto(js.SLO(max_latency="3s"))
    assert message.max_latency_ms == 3000
    assert not message.HasField("max_error") and not message.HasField("max_wan_kbps")
