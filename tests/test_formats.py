"""A source's formats: the same logs as CSV, JSON lines and Parquet, gzip-compressed or not,
read alike by the reference executor; malformed records and unreadable files counted."""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import jetstream as js
from jetstream.formats import input_files, is_input
from jetstream.queryfile import load_query

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "examples" / "logs"
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


def as_json(query: js.Query) -> js.Query:
    """The query reading its source as JSON lines."""
    source = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA, format="json")
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
