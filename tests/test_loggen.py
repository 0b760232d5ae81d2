"""The CDN log generator: the files parse, runs reproduce, and the traffic has the shape asked
for (Zipf popularity, regional differences, flash crowds, out-of-order and late records)."""

from __future__ import annotations

import csv
import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.cli import main
from jetstream.errors import DataError, PlanError
from jetstream.lab.loggen import FlashCrowd, LogSpec, generate, to_csv, write_live, write_logs
from jetstream.local import run_local

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SITES = ("ams", "sfo", "sin")


def count_by_pop() -> js.Query:
    logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
    return js.Query("n", logs.window(js.tumbling("10s"), watermark="5s").group_by("pop")
                    .agg(n=js.count(), bytes=js.sum("bytes"), slowest=js.max("latency_ms")))


def behind_ms(ts: np.ndarray) -> np.ndarray:
    """How far each record is behind the newest event time seen up to it."""
    return np.maximum.accumulate(ts) - ts


def domain_shares(domains: np.ndarray) -> dict[str, float]:
    names, counts = np.unique(domains, return_counts=True)
    return dict(zip(names.tolist(), (counts / counts.sum()).tolist(), strict=True))


def top(domains: np.ndarray, k: int) -> list[str]:
    shares = domain_shares(domains)
    return sorted(shares, key=lambda d: -shares[d])[:k]


def rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def stamps(files: list[Path]) -> np.ndarray:
    """The ts column of a site's files, read back in arrival order."""
    return np.array([int(row["ts"]) for path in files for row in rows(path)])


# -- format ------------------------------------------------------------------------------------

def test_written_logs_parse_with_the_cdn_schema(tmp_path: Path) -> None:
    spec = LogSpec(late_fraction=0.01)
    written = write_logs(tmp_path, SITES, start_ms=START, duration_s=20, rate=200, spec=spec,
                         seed=7, files=2)
    run = run_local(count_by_pop(), tmp_path)
    assert run.stats.rejects.total == 0
    assert run.stats.records_in == 3 * 20 * 200
    assert {row["pop"] for r in run for row in r.rows} == set(SITES)
    # Out of order by less than the watermark, so only the records stamped late are late,
    # and only in the second file: a file is judged against the files before it
    # (docs/dsl.md, "Late records"), and the first has none before it.
    late = sum(int((behind_ms(stamps(written[site]))[len(stamps(written[site][:1])):]
                    > 2000).sum()) for site in SITES)
    assert run.stats.late_records == late > 0
    assert sum(row["n"] for r in run for row in r.rows) == 3 * 20 * 200 - late

    header = (tmp_path / "ams" / "part-000.csv").read_text().splitlines()[0]
    assert header == "ts,pop,client_ip,domain,url,status,bytes,latency_ms,cache"


@settings(max_examples=25, deadline=None)
@given(domains=st.integers(1, 50), zipf=st.floats(0.2, 3.0), urls=st.integers(1, 10),
       clients=st.integers(1, 100), regional=st.floats(0, 1), disorder=st.floats(0, 5),
       late=st.floats(0, 0.5), duration=st.floats(0, 5), rate=st.floats(0, 100),
       seed=st.integers(0, 2**40))
def test_every_column_has_the_right_type_and_range(
        domains: int, zipf: float, urls: int, clients: int, regional: float, disorder: float,
        late: float, duration: float, rate: float, seed: int) -> None:
    spec = LogSpec(domains=domains, zipf=zipf, urls_per_domain=urls, clients_per_site=clients,
                   regional=regional, out_of_order_s=disorder, late_fraction=late, late_s=30)
    columns = generate("ams", START, duration, rate, spec, seed)
    n = round(rate * round(duration * 1000) / 1000)
    assert tuple(columns) == js.CDN_LOG_SCHEMA.names
    assert all(len(values) == n for values in columns.values())
    rows = list(csv.DictReader(io.StringIO(to_csv(columns))))
    assert len(rows) == n
    for row, ts in zip(rows, columns["ts"].tolist(), strict=True):
        assert int(row["ts"]) == ts
        assert START - 1000 * (disorder + 30) <= ts < START + 1000 * duration
        assert row["pop"] == "ams"
        octets = [int(o) for o in row["client_ip"].split(".")]
        assert len(octets) == 4 and all(0 <= o <= 255 for o in octets)
        number = int(row["domain"].removeprefix("site").removesuffix(".example.com"))
        assert 1 <= number <= domains
        assert row["url"].startswith(f"http://{row['domain']}/asset/")
        assert int(row["status"]) in {200, 206, 304, 404, 500, 503}
        assert int(row["bytes"]) > 0
        assert float(row["latency_ms"]) > 0 and len(row["latency_ms"].split(".")[1]) == 2
        assert row["cache"] in {"HIT", "MISS"}


def test_to_csv_refuses_columns_of_different_lengths() -> None:
    with pytest.raises(DataError, match="differ in length"):
        to_csv({"a": np.arange(2), "b": np.arange(3)})


# -- reproducibility ---------------------------------------------------------------------------

def test_the_same_seed_gives_the_same_bytes(tmp_path: Path) -> None:
    def files(folder: str, seed: int) -> list[bytes]:
        written = write_logs(tmp_path / folder, SITES, start_ms=START, duration_s=5, rate=300,
                             seed=seed, files=2)
        return [p.read_bytes() for site in SITES for p in written[site]]

    assert files("a", 1) == files("b", 1)
    assert all(x != y for x, y in zip(files("a", 1), files("c", 2), strict=True))
    ams, sfo = generate("ams", START, 5, 300, LogSpec(), 1), generate("sfo", START, 5, 300,
                                                                      LogSpec(), 1)
    assert (ams["client_ip"] != sfo["client_ip"]).all()


def test_one_file_is_what_generate_gives(tmp_path: Path) -> None:
    spec = LogSpec(domains=100)
    written = write_logs(tmp_path, ["ams"], start_ms=START, duration_s=3, rate=100, spec=spec,
                         seed=5)
    assert written["ams"][0].read_text() == to_csv(generate("ams", START, 3, 100, spec, 5))


# -- the shape of the traffic ------------------------------------------------------------------

@pytest.mark.parametrize("zipf", [0.8, 1.1, 1.5])
def test_domain_popularity_is_zipf(zipf: float) -> None:
    spec = LogSpec(zipf=zipf, regional=0)
    counts = np.sort(np.unique(generate("ams", START, 20, 10_000, spec, 3)["domain"],
                               return_counts=True)[1])[::-1][:100]
    slope = np.polyfit(np.log(np.arange(1, 101)), np.log(counts), 1)[0]
    assert -slope == pytest.approx(zipf, abs=0.15)


def test_sites_differ_in_their_top_domains_only_when_regional() -> None:
    def tops(regional: float) -> list[list[str]]:
        spec = LogSpec(regional=regional)
        return [top(generate(site, START, 10, 5000, spec, 0)["domain"], 10) for site in SITES]

    same = tops(0)
    assert same[0][:3] == same[1][:3] == same[2][:3] == [f"site{i}.example.com" for i in (1, 2, 3)]
    regional = tops(0.3)
    assert len({tuple(t) for t in regional}) == 3
    assert all(t[0] == "site1.example.com" for t in regional)  # global favourites still lead


def test_a_flash_crowd_dominates_its_site_while_it_lasts() -> None:
    hot = "site500.example.com"
    spec = LogSpec(late_fraction=0, flash_crowds=(FlashCrowd(hot, "sfo", 10, 20, share=0.3),))
    sfo, ams = (generate(site, START, 30, 2000, spec, 0) for site in ("sfo", "ams"))

    def share(columns: dict[str, Any], lo_s: float, hi_s: float) -> float:
        seconds = (columns["ts"] - START) / 1000
        during = (seconds >= lo_s) & (seconds < hi_s)
        return domain_shares(columns["domain"][during]).get(hot, 0.0)

    assert top(sfo["domain"][np.abs((sfo["ts"] - START) / 1000 - 15) < 3], 1) == [hot]
    assert share(sfo, 12, 18) == pytest.approx(0.3, abs=0.03)
    assert share(sfo, 0, 8) < 0.01 and share(sfo, 22, 30) < 0.01
    assert share(ams, 12, 18) < 0.01


def test_a_made_up_flash_crowd_domain_is_served_too() -> None:
    spec = LogSpec(flash_crowds=(FlashCrowd("launch.example.org", "ams", 0, 5, share=1.0),))
    columns = generate("ams", START, 5, 100, spec, 0)
    assert set(columns["domain"].tolist()) == {"launch.example.org"}
    assert all(u.startswith("http://launch.example.org/asset/") for u in columns["url"])


def test_records_are_as_out_of_order_and_late_as_asked() -> None:
    spec = LogSpec(out_of_order_s=2, late_fraction=0.02, late_s=30)
    behind = behind_ms(generate("ams", START, 50, 1000, spec, 0)["ts"])
    late = behind > 2000
    assert late.mean() == pytest.approx(0.02, abs=0.004)
    assert behind[late].min() > 25_000
    assert 1900 < behind[~late].max() < 2000

    in_order = LogSpec(out_of_order_s=0, late_fraction=0)
    assert (np.diff(generate("ams", START, 5, 1000, in_order, 0)["ts"]) >= 0).all()


def test_realistic_mix_of_statuses_hits_sizes_and_latencies() -> None:
    columns = generate("ams", START, 100, 1000, LogSpec(), 0)
    status, latency = columns["status"], columns["latency_ms"]
    assert 0.85 < (status == 200).mean() < 0.93
    assert 0.005 < (status >= 500).mean() < 0.015
    assert 0.8 < (columns["cache"] == "HIT").mean() < 0.87
    hit = columns["cache"] == "HIT"
    assert np.median(latency[~hit]) > 3 * np.median(latency[hit])
    assert np.percentile(latency, 99.9) > 10 * np.median(latency)  # a heavy tail
    ok = status == 200
    sizes: dict[str, set[int]] = {}
    for url, size in zip(columns["url"][ok].tolist()[:5000], columns["bytes"][ok].tolist(),
                         strict=False):
        sizes.setdefault(url, set()).add(size)
    assert max(max(s) - min(s) for s in sizes.values()) < 600  # the same object, new headers


# -- files -------------------------------------------------------------------------------------

def test_write_logs_splits_the_period_into_files_in_time_order(tmp_path: Path) -> None:
    spec = LogSpec(late_fraction=0)
    written = write_logs(tmp_path, ["ams", "sin"], start_ms=START, duration_s=9, rate=100,
                         spec=spec, files=3)
    assert [p.name for p in written["ams"]] == ["part-000.csv", "part-001.csv", "part-002.csv"]
    assert sorted(p.name for p in (tmp_path / "ams").iterdir()) == ["part-000.csv",
                                                                    "part-001.csv",
                                                                    "part-002.csv"]
    per_file = [[int(r["ts"]) for r in rows(p)] for p in written["sin"]]
    assert [len(s) for s in per_file] == [300, 300, 300]
    for i, s in enumerate(per_file):
        assert START + 3000 * i - 2000 <= min(s) and max(s) < START + 3000 * (i + 1)


def test_write_live_writes_a_file_per_site_and_chunk(tmp_path: Path) -> None:
    now = [1000.0]

    def clock() -> float:  # a second passes between looks at the clock: nothing waits
        now[0] += 1
        return now[0]

    stop, seen = threading.Event(), []

    def on_chunk(index: int, records: int) -> None:
        seen.append((index, records))
        if index == 2:
            stop.set()

    total = write_live(tmp_path, ["ams", "sfo"], rate=50, spec=LogSpec(late_fraction=0),
                       chunk_s=1, stop=stop, clock=clock, on_chunk=on_chunk)
    assert total == 300 and seen == [(0, 100), (1, 100), (2, 100)]
    names = [f"live-{1_001_000 + 1000 * k:013d}.csv" for k in range(3)]
    assert sorted(p.name for p in (tmp_path / "sfo").iterdir()) == names
    for k, name in enumerate(names):
        chunk = stamps([tmp_path / "ams" / name])
        assert len(chunk) == 50
        begin = 1_001_000 + 1000 * k  # event times = the chunk just past, up to 2s out of order
        assert begin - 2000 < chunk.min() and chunk.max() < begin + 1000


def test_write_live_waits_for_the_clock(tmp_path: Path) -> None:
    stop = threading.Event()
    chunks: list[int] = []

    def on_chunk(index: int, records: int) -> None:
        chunks.append(records)
        if index == 1:
            stop.set()

    assert write_live(tmp_path, ["ams"], rate=1000, chunk_s=0.02, stop=stop,
                      on_chunk=on_chunk) == 40
    assert chunks == [20, 20]


# -- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("domains", 0), ("domains", 2.5), ("zipf", 0), ("zipf", float("nan")),
    ("urls_per_domain", 0), ("clients_per_site", -1), ("regional", 1.5),
    ("out_of_order_s", -1), ("late_fraction", -0.1), ("late_s", "30s"),
    ("flash_crowds", ("site1.example.com",)),
])
def test_a_bad_spec_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(PlanError, match=f"log spec: {field} must"):
        LogSpec(**{field: value})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"domain": "a,b"}, "must be a host name"),
    ({"start_s": 5, "end_s": 5}, "0 <= start_s < end_s"),
    ({"share": 0}, r"share must be in \(0, 1\]"),
])
def test_a_bad_flash_crowd_says_what_is_wrong(kwargs: dict[str, Any], message: str) -> None:
    crowd = {"domain": "site9.example.com", "site": "ams", "start_s": 0, "end_s": 10} | kwargs
    with pytest.raises(PlanError, match=message):
        FlashCrowd(**crowd)


def test_a_flash_crowd_at_a_site_not_written_is_refused(tmp_path: Path) -> None:
    spec = LogSpec(flash_crowds=(FlashCrowd("site9.example.com", "lhr", 0, 10),))
    with pytest.raises(PlanError, match="'lhr' is not among the sites written"):
        write_logs(tmp_path, SITES, start_ms=START, duration_s=1, rate=1, spec=spec)


def test_bad_run_arguments_are_refused() -> None:
    with pytest.raises(PlanError, match="rate must be"):
        generate("ams", START, 1, -1, LogSpec(), 0)
    with pytest.raises(PlanError, match="seed must be"):
        generate("ams", START, 1, 1, LogSpec(), -1)
    with pytest.raises(PlanError, match="site 'a b' must be a site name"):
        generate("a b", START, 1, 1, LogSpec(), 0)


# -- the command line --------------------------------------------------------------------------

def test_gen_logs_writes_every_cdn_site_of_the_topology(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gen-logs", "--out", str(tmp_path), "--duration", "4s", "--rate", "50",
                 "--files", "2", "--start", str(START), "--seed", "3",
                 "--flash-crowd", "site77.example.com@sfo:1-3"]) == 0
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.csv")) == [
        f"{site}/part-00{i}.csv" for site in SITES for i in (0, 1)]
    err = capsys.readouterr().err
    assert "ams: 200 records" in err and "600 records" in err and "lines/s" in err
    assert run_local(count_by_pop(), tmp_path).stats.records_in == 600


def test_gen_logs_live_stops_after_the_duration(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gen-logs", "--out", str(tmp_path), "--live", "--duration", "200ms",
                 "--chunk", "100ms", "--rate", "100"]) == 0
    assert len(list((tmp_path / "ams").glob("live-*.csv"))) == 2
    assert "chunk 1" in capsys.readouterr().err


@pytest.mark.parametrize(("argument", "message"), [
    ("site1.example.com@ams", "DOMAIN@SITE:START-END"),
    ("site1.example.com@lhr:1-2", "'lhr' is not among the sites written"),
])
def test_gen_logs_refuses_a_bad_flash_crowd(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            argument: str, message: str) -> None:
    assert main(["gen-logs", "--out", str(tmp_path), "--flash-crowd", argument]) == 1
    assert message in capsys.readouterr().err
