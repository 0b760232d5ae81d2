"""A source's formats: the same logs as CSV, JSON lines and Parquet, gzip-compressed or not,
read alike by the reference executor; malformed records and unreadable files counted."""

from __future__ import annotations

import csv
import gzip
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import jetstream as js
from jetstream.aggtree.generate import to_yaml
from jetstream.aggtree.loader import parse_topology
from jetstream.control.global_controller import GlobalController
from jetstream.control.launch import LocalCluster, replay
from jetstream.formats import input_files, is_input
from jetstream.planwire import query_from_bytes, query_to_proto
from jetstream.queryfile import load_query
from tests.conftest import plan_of
from tests.test_control import FakeSites, register_all

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "examples" / "logs"
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
QUERY = load_query(ROOT / "examples" / "cdn_topk.py")
INT_COLUMNS = {f.name for f in js.CDN_LOG_SCHEMA if f.dtype.value == "int"}
FLOAT_COLUMNS = {f.name for f in js.CDN_LOG_SCHEMA if f.dtype.value == "float"}


def typed(row: dict[str, str]) -> dict[str, Any]:
    """A CSV row of the sample logs as a JSON object would hold it: numbers as numbers."""
    return {k: int(v) if k in INT_COLUMNS else float(v) if k in FLOAT_COLUMNS else v
            for k, v in row.items()}


def sample_rows(site: str) -> list[dict[str, Any]]:
    """The sample logs' well-formed rows of ``site``, typed (its broken line left out)."""
    with (LOGS / site / "part-000.csv").open(newline="") as fh:
        return [typed(r) for r in csv.DictReader(fh) if None not in r.values()]


def write_json(out: Path, *, gz: bool = False, extra: Sequence[str] = ()) -> Path:
    for site in ("ams", "sfo", "sin"):
        rows = sample_rows(site)
        text = "".join(json.dumps(r) + "\n" for r in rows) + "".join(f"{e}\n" for e in extra)
        folder = out / site
        folder.mkdir(parents=True)
        if gz:
            (folder / "part-000.jsonl.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (folder / "part-000.jsonl").write_text(text)
    return out


def write_parquet(out: Path, **columns: Any) -> Path:
    """Each site's sample rows as a Parquet file, ``columns`` replacing some (None: left
    out)."""
    for site in ("ams", "sfo", "sin"):
        rows = sample_rows(site)
        table = {f.name: [r[f.name] for r in rows] for f in js.CDN_LOG_SCHEMA}
        for name, values in columns.items():
            if values is None:
                del table[name]
            else:
                table[name] = values(len(rows))
        (out / site).mkdir(parents=True)
        pq.write_table(pa.table(table), out / site / "part-000.parquet")
    return out


def as_json(query: js.Query, format: str = "json") -> js.Query:
    """The query reading its source in another format (JSON lines by default)."""
    source = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA, format=format)
    stream = source.where(js.col("status") < 500).with_column("kb", js.col("bytes") / 1024)
    q = (stream.window(js.tumbling("10s"), watermark="5s").group_by("domain")
         .agg(requests=js.count(), kb=js.sum("kb")).top_k(10, by="requests"))
    return js.Query(query.name, q, slo=query.slo)


def test_json_lines_and_gzip_read_as_the_csv_they_came_from(tmp_path: Path) -> None:
    csv_results = js.run_local(QUERY, LOGS)
    assert csv_results.stats.rejects.total == 1  # the sample's broken line
    gz_csv = tmp_path / "gz-csv"
    for site in ("ams", "sfo", "sin"):
        (gz_csv / site).mkdir(parents=True)
        (gz_csv / site / "part-000.csv.gz").write_bytes(
            gzip.compress((LOGS / site / "part-000.csv").read_bytes()))
    assert js.run_local(QUERY, gz_csv) == csv_results
    query = as_json(QUERY)
    for gz in (False, True):
        got = js.run_local(query, write_json(tmp_path / f"json-{gz}", gz=gz))
        assert got == csv_results
        assert got.stats.rejects.total == 0  # the broken line was left out of the JSON


def test_bad_json_records_are_counted_by_reason_and_the_rest_read(tmp_path: Path) -> None:
    bad = ['{"ts": 1', "[1, 2]", '{"ts": "soon"}', '{"ts": 5}',
           json.dumps({**sample_rows("ams")[0], "status": "200x"}),
           json.dumps({**sample_rows("ams")[0], "domain": {"nested": 1}}), ""]
    got = js.run_local(as_json(QUERY), write_json(tmp_path / "j", extra=bad))
    assert got == js.run_local(QUERY, LOGS)
    counts = got.stats.rejects.counts
    assert counts == {"malformed record": 6, "missing field": 3, "ill-typed field": 9}, counts


def test_a_corrupt_gzip_file_is_counted_and_set_aside_whole(tmp_path: Path) -> None:
    folder = tmp_path / "logs" / "ams"
    folder.mkdir(parents=True)
    whole = gzip.compress((LOGS / "ams" / "part-000.csv").read_bytes())
    (folder / "part-000.csv.gz").write_bytes(whole[: len(whole) // 2])  # cut off mid-stream
    (folder / "part-001.csv.gz").write_bytes(b"not gzip at all")
    got = js.run_local(QUERY, tmp_path / "logs")
    assert got.stats.records_in == 0  # none of a half-read file
    assert got.stats.rejects.counts == {"unreadable file": 2}
    assert {r.where for r in got.stats.rejects.kept} == {
        str(folder / "part-000.csv.gz"), str(folder / "part-001.csv.gz")}


def test_parquet_reads_as_the_csv_it_came_from_and_a_file_that_does_not_fit_is_set_aside(
        tmp_path: Path) -> None:
    query = as_json(QUERY, "parquet")
    assert js.run_local(query, write_parquet(tmp_path / "p")) == js.run_local(QUERY, LOGS)
    # A column of another type than the schema's: the whole file, at every site.
    wrong = js.run_local(query, write_parquet(tmp_path / "wrong",
                                              status=lambda n: [str(i) for i in range(n)]))
    assert wrong == [] and wrong.stats.rejects.counts == {"unreadable file": 3}
    assert "column status holds string, not int (int64)" in wrong.stats.rejects.kept[0].reason
    # A column left out: every record lacks that field.
    lacking = js.run_local(query, write_parquet(tmp_path / "lacking", cache=None))
    records = sum(len(sample_rows(site)) for site in ("ams", "sfo", "sin"))
    assert lacking == [] and lacking.stats.rejects.counts == {"missing field": records}
    # Nulls and a NaN: those records, not the file.
    holes = js.run_local(query, write_parquet(
        tmp_path / "holes", latency_ms=lambda n: [None, math.nan] + [1.0] * (n - 2)))
    assert holes.stats.rejects.counts == {"missing field": 3, "ill-typed field": 3}
    cut = tmp_path / "cut" / "ams"
    cut.mkdir(parents=True)
    whole = (tmp_path / "p" / "ams" / "part-000.parquet").read_bytes()
    (cut / "part-000.parquet").write_bytes(whole[: len(whole) // 2])
    assert js.run_local(query, cut).stats.rejects.counts == {"unreadable file": 1}


def test_a_file_is_a_source_s_input_by_its_suffix(tmp_path: Path) -> None:
    for name in ("a.csv", "b.csv.gz", "c.jsonl", "d.json.gz", "e.ndjson", "f.parquet",
                 ".g.csv", "_h.csv", "notes.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in input_files(tmp_path)] == ["a.csv", "b.csv.gz"]
    assert [p.name for p in input_files(tmp_path, "json")] == ["c.jsonl", "d.json.gz",
                                                               "e.ndjson"]
    assert [p.name for p in input_files(tmp_path, "parquet")] == ["f.parquet"]
    assert not is_input(".g.csv") and not is_input("x.csv.tmp")


def test_a_source_names_a_format_it_knows() -> None:
    with pytest.raises(js.PlanError, match=r"source logs: format must be one of csv, json, "
                                           r"parquet, not 'xml'"):
        js.source("logs", schema=js.CDN_LOG_SCHEMA, format="xml")
    plan = js.source("logs", schema=js.CDN_LOG_SCHEMA, format="json").plan
    assert plan.op(plan.sink).describe() == "source logs (json)"


# --- where a source's format is declared -------------------------------------------------------

LOCAL_3DC = TOPOLOGY.read_text()
CDN_SOURCE = "{name: cdn_logs, events_per_s: 100, bytes_per_event: 110, distinct_keys: 50"


def declared(format: str, sites: int = 3) -> str:
    """local-3dc with its first ``sites`` sites declaring the source's files ``format``."""
    return LOCAL_3DC.replace(CDN_SOURCE, CDN_SOURCE + f", format: {format}", sites)


def test_a_topology_declares_a_source_s_format_the_same_at_every_site() -> None:
    topology = parse_topology(declared("json"))
    assert topology.source_format("cdn_logs") == "json"
    assert parse_topology(LOCAL_3DC).source_format("cdn_logs") is None
    assert parse_topology(to_yaml(topology)).source_format("cdn_logs") == "json"
    with pytest.raises(js.PlacementError, match=r"sites\[0\].sources\[0\].format: expected one of "
                                           r"csv, json, parquet, got 'xml'"):
        parse_topology(declared("xml"))
    with pytest.raises(js.PlacementError, match=r"source cdn_logs is csv at site sfo and json at "
                                           r"site ams: a source's files have one format"):
        parse_topology(declared("json", sites=1))


def test_a_query_reads_the_declared_format_and_one_that_disagrees_is_refused_at_submit(
) -> None:
    sites = FakeSites()
    controller = GlobalController(parse_topology(declared("json")), sites.deploy, sites.stop)
    register_all(controller)
    state = controller.submit(plan_of(ROOT / "examples" / "cdn_topk.py"))  # names none
    assert [s.format for s in state.query.plan().sources()] == ["json"]
    # What the sites are sent reads JSON lines too.
    sent = query_from_bytes(state.spec)
    assert [s.format for s in sent.plan().sources()] == ["json"]
    csv_query = js.Query("csv-topk", js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA,
                                               format="csv")
                         .window(js.tumbling("10s")).agg(n=js.count()))
    with pytest.raises(js.PlanError, match=r"query csv-topk: source cdn_logs is read as csv, "
                                           r"and the topology's sites declare its files json"):
        controller.submit(query_to_proto(csv_query))


def test_two_queries_that_read_a_source_in_two_formats_are_refused_naming_both() -> None:
    sites = FakeSites()
    controller = GlobalController(parse_topology(LOCAL_3DC), sites.deploy, sites.stop)
    register_all(controller)
    controller.submit(query_to_proto(as_json(QUERY)))
    with pytest.raises(js.PlanError, match=r"query other: source cdn_logs is read as csv, and "
                                           r"query cdn-topk reads it as json: a site reads a "
                                           r"source's files one way"):
        controller.submit(query_to_proto(js.Query("other", QUERY.stream)))
    assert set(controller.queries) == {"cdn-topk"}
    controller.cancel("cdn-topk")
    controller.submit(query_to_proto(js.Query("other", QUERY.stream)))  # free again


def test_the_format_is_checked_again_where_a_query_starts() -> None:
    """Two submits racing: one passed its check before the other started. Starting is
    refused all the same, under the lock that starts it."""
    sites = FakeSites()
    controller = GlobalController(parse_topology(LOCAL_3DC), sites.deploy, sites.stop)
    register_all(controller)
    other = js.Query("other", QUERY.stream)
    with controller.lock:
        checked = controller.running.read_as(other)  # passes: nothing runs yet
    controller.submit(query_to_proto(as_json(QUERY)))
    with controller.lock, pytest.raises(js.PlanError, match="query cdn-topk reads it as json"):
        controller.running.start(checked, b"")
    assert set(controller.queries) == {"cdn-topk"}


# --- through the distributed path: Spark at each site ------------------------------------------

def in_format(format: str) -> str:
    """The example query's file, reading its source in ``format``."""
    text = (ROOT / "examples" / "cdn_topk.py").read_text().replace(
        "schema=js.CDN_LOG_SCHEMA)", f"schema=js.CDN_LOG_SCHEMA, format={format!r})")
    assert f"format={format!r}" in text
    return text.replace('js.Query("cdn-topk"', f'js.Query("topk-{format}"')


def test_the_sites_read_every_format_as_run_local_does(tmp_path: Path) -> None:
    """One replay of every site's folder holding the same logs three times -- JSON lines
    (gzip-compressed at sin, with bad records at every site), gzip-compressed CSV and
    Parquet -- each with a file a reader must set aside whole (cut off, no gzip, a column of
    another type), and a note that is no log file: each query reads its source's format
    only, and equals run_local."""
    logs = write_json(tmp_path / "logs", extra=['{"ts": 1', '{"ts": 5}', ""])
    sin = logs / "sin" / "part-000.jsonl"
    (logs / "sin" / "part-000.jsonl.gz").write_bytes(gzip.compress(sin.read_bytes()))
    sin.unlink()
    whole = gzip.compress((LOGS / "ams" / "part-000.csv").read_bytes())
    for site in ("ams", "sfo", "sin"):
        (logs / site / "part-000.csv.gz").write_bytes(
            gzip.compress((LOGS / site / "part-000.csv").read_bytes()))
    # Half of a file whose records would change the counts if read; one that is no gzip.
    (logs / "sfo" / "part-001.csv.gz").write_bytes(whole[: len(whole) // 2])
    (logs / "sin" / "part-001.jsonl.gz").write_bytes(b"no gzip")
    parquet = write_parquet(tmp_path / "parquet")
    wrong = write_parquet(tmp_path / "wrong", status=lambda n: [str(i) for i in range(n)])
    for site in ("ams", "sfo", "sin"):
        (parquet / site / "part-000.parquet").rename(logs / site / "part-000.parquet")
    (wrong / "ams" / "part-000.parquet").rename(logs / "ams" / "part-001.parquet")
    (logs / "sfo" / "notes.txt").write_text("not a log file: no reader reads it\n")

    want = [(r.window_start, r.rows) for r in js.run_local(QUERY, LOGS)]
    expected = {"json": {"malformed record": 3, "missing field": 3, "unreadable file": 1},
                "csv": {"wrong field count": 1, "unreadable file": 1},
                "parquet": {"unreadable file": 1}}
    with LocalCluster(TOPOLOGY, logs, replay=True, window_deadline_s=120,
                      logs=tmp_path / "cluster") as cluster:
        for format, rejects in expected.items():
            query = tmp_path / f"{format}_topk.py"
            query.write_text(in_format(format))
            local = js.run_local(load_query(query), logs)
            assert [(r.window_start, r.rows) for r in local] == want, format
            assert local.stats.rejects.counts == rejects, format
            got = replay(cluster, query, timeout_s=240)
            assert [(r.window_start, r.rows) for r in got] == want, format
            assert all(r.exact and r.sites_reporting == 3 for r in got), format
        # A query submitted again under the name of one that finished, over the same input:
        # its batches are those of the first run, and the root takes them all the same.
        again = replay(cluster, tmp_path / "json_topk.py", timeout_s=240)
        assert [(r.window_start, r.rows) for r in again] == want
