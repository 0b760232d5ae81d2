"""Lookup joins with reference tables: reading the table, the DSL's checks, the reference
executor's meaning, and the rewrite that moves filters on the table's columns below the join."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import col
from jetstream.errors import PlanError
from jetstream.queryfile import load_query
from jetstream.rewrite.push_filters import MAX_PUSHED_KEYS
from jetstream.tables import MAX_TABLE_BYTES, MAX_TABLE_ROWS, Table
from tests.conftest import log

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
SCHEMA = js.Schema.of({"domain": js.DataType.STRING, "customer": js.DataType.STRING,
                       "tier": js.DataType.STRING, "weight": js.DataType.INT})
ROWS = (
    {"domain": "a.com", "customer": "acme", "tier": "gold", "weight": 3},
    {"domain": "b.com", "customer": "bolt", "tier": "silver", "weight": None},
    {"domain": "c.com", "customer": "acme", "tier": "gold", "weight": 1},
    {"domain": "e.com", "customer": "echo", "tier": None, "weight": 2},
)
CUSTOMERS = Table("customers", SCHEMA, ROWS)
DOMAINS = ["a.com", "b.com", "c.com", "d.com", "e.com"]


def events(n: int = 40) -> list[dict[str, Any]]:
    return [log(1_000 + 300 * i, DOMAINS[i % len(DOMAINS)]) for i in range(n)]


def by_customer(stream: js.Stream) -> js.Query:
    return js.Query("q", stream.window(js.tumbling("10s"), watermark="1s")
                    .group_by("customer").agg(n=js.count(), bytes=js.sum("bytes")))


def test_the_table_is_read_from_csv_relative_to_the_query_file(tmp_path: Path) -> None:
    (tmp_path / "customers.csv").write_text(
        "tier,domain,customer,weight,note\ngold,a.com,acme,3,x\nsilver,b.com,bolt,,y\n")
    (tmp_path / "q.py").write_text(
        "import jetstream as js\n"
        "customers = js.table('customers', 'customers.csv', schema=js.Schema.of({\n"
        "    'domain': js.DataType.STRING, 'customer': js.DataType.STRING,\n"
        "    'tier': js.DataType.STRING, 'weight': js.DataType.INT}))\n"
        "logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)\n"
        "query = js.Query('q', logs.join(customers, on='domain')\n"
        "    .window(js.tumbling('10s')).group_by('customer').agg(n=js.count()))\n")
    query = load_query(tmp_path / "q.py")
    join = next(op for op in map(query.plan().op, query.plan().topological())
                if op.kind == "join")
    assert join.table.rows == ({"domain": "a.com", "customer": "acme", "tier": "gold",
                                "weight": 3},
                               {"domain": "b.com", "customer": "bolt", "tier": "silver",
                                "weight": None})
    assert join.describe() == "inner join customers on domain"


@pytest.mark.parametrize(("text", "error"), [
    ("domain,customer\na.com,acme\n", "has no column 'tier'"),
    ("domain,customer,tier,weight\na.com,acme,gold,three\n",
     r"customers.csv:2: column weight: invalid literal for int"),
    ("domain,customer,tier,weight\na.com,acme\n", r"customers.csv:2: 2 fields, the header has 4"),
    ("", "is empty; it needs a header row"),
])
def test_a_bad_table_file_is_refused_naming_the_line_and_column(tmp_path: Path, text: str,
                                                                error: str) -> None:
    (tmp_path / "customers.csv").write_text(text)
    with pytest.raises(PlanError, match=error):
        js.table("customers", tmp_path / "customers.csv", schema=SCHEMA)


def test_a_table_too_big_to_travel_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    big.write_text("domain,customer,tier,weight\n" + "x" * MAX_TABLE_BYTES)
    with pytest.raises(PlanError, match="more than the 2,097,152 a reference table may have"):
        js.table("big", big, schema=SCHEMA)
    with pytest.raises(PlanError, match="cannot read"):
        js.table("gone", tmp_path / "gone.csv", schema=SCHEMA)


def test_a_table_of_too_many_rows_is_refused() -> None:
    rows = tuple({"domain": f"d{i}", "customer": "c", "tier": "gold", "weight": 1}
                 for i in range(MAX_TABLE_ROWS + 1))
    with pytest.raises(PlanError, match="100,001 rows, more than the 100,000"):
        Table("big", SCHEMA, rows)


def test_a_filter_that_too_many_table_rows_pass_stays_above_the_join() -> None:
    rows = tuple({"domain": f"d{i}.com", "customer": "c", "tier": "gold", "weight": i}
                 for i in range(MAX_PUSHED_KEYS + 1))
    query = by_customer(LOGS.join(Table("many", SCHEMA, rows), on="domain")
                        .where(col("tier") == "gold"))
    assert ("stays above `inner join many on domain`: 1,001 table rows pass it, more than the "
            "1,000 keys a filter below the join may list") in js.explain(query)
    assert js.run_local(js.optimize(query), events()) == js.run_local(query, events())


@pytest.mark.parametrize(("build", "error"), [
    (lambda: LOGS.join(CUSTOMERS, on="nope"), "unknown column 'nope'"),
    (lambda: LOGS.join(CUSTOMERS, on="pop"), "the table has no column 'pop'"),
    (lambda: LOGS.join(CUSTOMERS, on="domain", how="outer"), "how is 'inner' or 'left'"),
    (lambda: LOGS.join("customers", on="domain"), "expected a js.table"),
    (lambda: LOGS.window(js.tumbling("10s")).join(CUSTOMERS, on="domain"),
     "join the records before the window"),
    (lambda: LOGS.join(Table("t", js.Schema.of({"status": js.DataType.STRING}), ()),
                       on="status"), "status is int here but string in the table"),
    (lambda: LOGS.join(Table("t", js.Schema.of({"domain": js.DataType.STRING,
                                                "bytes": js.DataType.INT}), ()),
                       on="domain"), "the table's column 'bytes' is already a column"),
    (lambda: LOGS.join(Table("t", SCHEMA, (ROWS[0], ROWS[0])), on="domain"),
     "the table has two rows for 'a.com'"),
])
def test_a_join_that_cannot_run_is_refused_when_built(build: Any, error: str) -> None:
    with pytest.raises(PlanError, match=error):
        build()


def test_inner_and_left_joins_in_the_reference_executor() -> None:
    inner = js.run_local(by_customer(LOGS.join(CUSTOMERS, on="domain")), events(10))
    assert inner[0].rows == [{"customer": "acme", "n": 4, "bytes": 4000},
                             {"customer": "bolt", "n": 2, "bytes": 2000},
                             {"customer": "echo", "n": 2, "bytes": 2000}]
    left = js.run_local(by_customer(LOGS.join(CUSTOMERS, on="domain", how="left")), events(10))
    assert left[0].rows[-1] == {"customer": None, "n": 2, "bytes": 2000}  # d.com: no row


@settings(max_examples=60, deadline=None)
@given(condition=st.sampled_from([
    col("tier") == "gold", col("tier") != "gold", col("weight") > 1, col("weight").isin(2, 3),
    (col("tier") == "gold") | (col("weight") == 2), ~(col("customer") == "acme"),
    col("customer").lower() == "acme", col("tier") == "platinum",
    (col("tier") == "gold") & (col("bytes") > 1000),  # reads the record too
    col("bytes") > 1000,  # the record's alone
]), how=st.sampled_from(["inner", "left"]), n=st.integers(0, 60))
def test_filters_on_the_table_move_below_the_join_without_changing_the_answer(
        condition: Any, how: str, n: int) -> None:
    query = by_customer(LOGS.join(CUSTOMERS, on="domain", how=how).where(condition))
    records = [log(1_000 + 300 * i, DOMAINS[i % 5], bytes=500 + 100 * (i % 20))
               for i in range(n)]
    assert js.run_local(js.optimize(query), records) == js.run_local(query, records)


def test_explain_says_what_a_filter_on_the_table_became() -> None:
    text = js.explain(by_customer(LOGS.join(CUSTOMERS, on="domain").where(col("tier") == "gold")))
    assert ("moved `where tier == 'gold'` below `inner join customers on domain` as "
            "`where domain.isin('a.com', 'c.com')` (the domain of the 2 table rows that pass "
            "it)") in text
    text = js.explain(by_customer(LOGS.join(CUSTOMERS, on="domain", how="left")
                                  .where(col("tier") != "gold")))
    assert "moved `where tier != 'gold'` below `left join" in text
    text = js.explain(by_customer(LOGS.join(CUSTOMERS, on="domain", how="left")
                                  .where((col("tier") == "gold") | (js.lit(1) == 1))))
    assert "it keeps the records the left join finds no row for" in text
