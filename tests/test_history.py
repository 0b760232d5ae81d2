"""History queries, without processes: what the stored cubes can answer (and the refusals
naming what they lack), and answers from the sites' own windows and their rollups equal to
the reference executor's over the same records."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import col
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.cubes import CubeStore
from jetstream.dataplane.history import plan_history
from jetstream.dataplane.partials import PartialBatch
from jetstream.errors import PlanError
from jetstream.rewrite import distributed, site_part
from tests.conftest import log

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
MINUTE, HOUR = 60_000, 3_600_000
NOW = 10 * HOUR  # "now", in the event time the tests' records are stamped with
SITES = ("ams", "sfo", "sin")


def kept(stream: js.Stream) -> js.Stream:
    """The stored query's steps before its window: the CDN query's."""
    return stream.where(col("status") < 500).with_column("kb", col("bytes") / 1024)


STORED = js.Query("cdn", kept(LOGS).window(js.tumbling("10s"), watermark="5s")
                  .group_by("domain", "cache")
                  .agg(requests=js.count(), kb=js.sum("kb"), users=js.count_distinct("client_ip"))
                  .top_k(10, by="requests"))


def history(stream: js.Stream, name: str = "h") -> js.Query:
    return js.Query(name, stream)


def plan(query: js.Query, since_ms: int = NOW - 30 * MINUTE, until_ms: int = NOW) -> Any:
    return plan_history(query, [STORED], since_ms=since_ms, until_ms=until_ms, now_ms=NOW)


def test_a_window_made_of_kept_windows_reads_the_coarsest_that_reaches_back() -> None:
    per_minute = history(kept(LOGS).window(js.tumbling("1m")).group_by("domain")
                         .agg(n=js.count(), kb=js.sum("kb")))
    got = plan(per_minute)
    assert (got.resolution_ms, got.rollup, got.keys) == (MINUTE, True, ("domain",))
    assert got.aggregates == (("n", "requests"), ("kb", "kb"))
    ten = history(kept(LOGS).window(js.sliding("30s", every="10s")).agg(n=js.count()))
    assert (plan(ten).resolution_ms, plan(ten).rollup) == (10_000, False)
    # Two days back: the 1 min rollups are kept for a day, the 1 h ones for 30 days.
    hourly = history(kept(LOGS).window(js.tumbling("1h")).agg(n=js.count()))
    assert plan(hourly, since_ms=NOW - 48 * HOUR).resolution_ms == HOUR
    # A filter on a stored key, before the window, is applied to the stored rows.
    one = history(kept(LOGS).where(col("cache") == "HIT").window(js.tumbling("1m"))
                  .group_by("domain").agg(n=js.count()))
    assert [str(e) for e in plan(one).where] == ["cache == 'HIT'"]


@pytest.mark.parametrize("query, words", [
    (kept(LOGS).window(js.tumbling("1m")).group_by("status").agg(n=js.count()),
     "cdn: its cubes keep no group key status (its keys: domain, cache)"),
    (kept(LOGS).window(js.tumbling("1m")).agg(p90=js.quantile("latency_ms", 0.9)),
     "its cubes hold requests=count(), kb=sum(kb), users=count_distinct(client_ip); not "
     "p90=quantile(latency_ms, 0.9)"),
    (LOGS.window(js.tumbling("1m")).agg(n=js.count()),
     "its steps before the window are where status < 500; with_column kb = bytes / 1024, "
     "the history query's differ"),
    (kept(LOGS).where(col("bytes") > 10).window(js.tumbling("1m")).agg(n=js.count()),
     "the history query's differ at `where bytes > 10`"),
    (kept(LOGS).window(js.tumbling("15s")).agg(n=js.count()),
     "its cubes are of 10 s, 1 min, 1 h; a window of 15 s every 15 s is not made of any"),
    (kept(js.source("other", schema=js.CDN_LOG_SCHEMA)).window(js.tumbling("1m"))
     .agg(n=js.count()), "it reads source cdn_logs, not other"),
], ids=["key", "aggregate", "steps", "filter", "resolution", "source"])
def test_what_the_cubes_cannot_answer_is_refused_naming_what_is_missing(
        query: js.Stream, words: str) -> None:
    with pytest.raises(PlanError, match="history of h: no stored cubes answer it; cdn: ") as e:
        plan(history(query))
    assert words in str(e.value)


def test_a_range_past_retention_is_refused() -> None:
    ten = history(kept(LOGS).window(js.tumbling("10s")).agg(n=js.count()))
    with pytest.raises(PlanError, match="its 10 s cubes are kept for 1 h, not back to --since"):
        plan(ten, since_ms=NOW - 2 * HOUR)
    with pytest.raises(PlanError, match="no query has run here yet"):
        plan_history(ten, [], since_ms=0, until_ms=NOW, now_ms=NOW)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), size=st.sampled_from(["10s", "30s", "1m", "2m"]),
       keys=st.sampled_from([(), ("domain",), ("cache", "domain")]), hits=st.booleans())
def test_history_from_each_sites_own_windows_equals_the_reference(
        tmp_path_factory: pytest.TempPathFactory, seed: int, size: str,
        keys: tuple[str, ...], hits: bool) -> None:
    """Each site keeps its own stage's 10 s windows in its inbox (beside a child's, which it
    merges but must not count as its own), rolled up to 1 min; a history query read from
    them equals run_local over every site's records."""
    rng = random.Random(seed)
    records = {site: [log(NOW - 20 * MINUTE + rng.randrange(10 * MINUTE),
                          f"d{rng.randrange(4)}.com", pop=site, status=rng.choice([200, 503]),
                          cache=rng.choice(["HIT", "MISS"]), bytes=rng.randrange(1 << 20),
                          client_ip=f"10.0.0.{rng.randrange(30)}")
                      for _ in range(rng.randrange(50, 200))] for site in SITES}
    for site_records in records.values():  # in time order: none late, here or in the reference
        site_records.sort(key=lambda r: r["ts"])
    stream = kept(LOGS).where(col("cache") == "HIT") if hits else kept(LOGS)
    query = history(stream.window(js.tumbling(size)).group_by(*keys)
                    .agg(n=js.count(), kb=js.sum("kb"), users=js.count_distinct("client_ip")))
    how = plan(query)
    site_query, partial = site_part(distributed(STORED))
    folder = tmp_path_factory.mktemp("cubes")
    batches: list[PartialBatch] = []
    for i, site in enumerate(SITES):
        with CubeStore(folder / f"{site}.sqlite") as store:
            for result in js.run_local(site_query, records[site]):
                window = (result.window_start, result.window_end)
                for origin in (site, f"child{i}"):  # a child's batch, merged here: not ours
                    store.receive(encode_batch(PartialBatch(
                        "cdn", window, origin, tuple(result.rows)), partial))
            store.roll_up("cdn", partial, js.tumbling("10s"), NOW, origins=[site])
            resolution = how.resolution_ms if how.rollup else None
            batches += [decode_batch(m, partial) for m in store.messages(
                "cdn", how.start_ms, how.end_ms, resolution, [site])]
    got = how.finish(batches, expected=SITES, unanswered={})
    want = js.run_local(query, sorted((r for site in SITES for r in records[site]),
                                      key=lambda r: r["ts"]))
    assert [(r.window_start, r.rows) for r in got] == [(r.window_start, r.rows) for r in want]
    assert all(r.history and r.exact and r.sites_reporting == 3 for r in got)


def test_a_site_that_does_not_answer_is_named_in_every_result(tmp_path: Path) -> None:
    query = history(kept(LOGS).window(js.tumbling("1m")).agg(n=js.count()))
    how = plan(query)
    window = (NOW - 10 * MINUTE, NOW - 10 * MINUTE + 10_000)
    batch = PartialBatch("cdn", window, "ams", ({"domain": "a", "cache": "HIT",
                                                 "requests": 2, "kb": 1.0, "users": {"x"}},))
    (result,) = how.finish([batch], expected=SITES, unanswered={"sin": "it is down"})
    assert (result.sites_reporting, result.sites_expected, result.missing_sites) == (
        2, 3, ["sin"])
    assert result.warnings == ["site sin did not answer (it is down): its records are missing"]
    assert result.rows == [{"n": 2}]


# -- with real processes: a live query, then history from the sites' cubes ------------------

STORED_FILE = """\
import jetstream as js
from jetstream import col
logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
query = js.Query("stored", logs.where(col("status") < 500)
                 .with_column("kb", col("bytes") / 1024)
                 .window(js.tumbling("10s"), watermark="5s").group_by("domain", "cache")
                 .agg(requests=js.count(), kb=js.sum("kb")).top_k(10, by="requests"))
"""
HISTORY_FILE = """\
import jetstream as js
from jetstream import col
logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
query = js.Query("past", logs.where(col("status") < 500)
                 .with_column("kb", col("bytes") / 1024).where(col("cache") == "HIT")
                 .window(js.tumbling(SIZE)).group_by("domain")
                 .agg(n=js.count(), kb=js.sum("kb")))
"""


def test_history_of_a_live_query_from_the_sites_cubes_equals_the_reference(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three sites run a query live over the last few minutes' records; a history query at
    10 s (the sites' own windows) and at 1 min (their rollups) answers from what the sites
    kept, through the controller, as the reference executor does over the same records."""
    from jetstream.control.codec import result_from_proto
    from jetstream.control.launch import LocalCluster
    from jetstream.queryfile import load_query

    topology = Path(__file__).resolve().parent.parent / "topologies" / "local-3dc.yaml"
    now = time.time_ns() // 1_000_000
    base = now - now % MINUTE - 3 * MINUTE
    rng = random.Random(3)
    names = [f.name for f in js.CDN_LOG_SCHEMA]
    for site in SITES:
        rows = sorted((log(base + rng.randrange(2 * MINUTE), f"d{rng.randrange(5)}.com",
                           pop=site, cache=rng.choice(["HIT", "MISS"]),
                           bytes=rng.randrange(1 << 20)) for _ in range(300)),
                      key=lambda r: r["ts"])
        folder = tmp_path / "input" / site
        folder.mkdir(parents=True)
        (folder / "part-0.csv").write_text(",".join(names) + "\n" + "".join(
            ",".join(str(r[n]) for n in names) + "\n" for r in rows))
    stored = tmp_path / "stored.py"
    stored.write_text(STORED_FILE)
    live = js.run_local(load_query(stored), tmp_path / "input")
    with LocalCluster(topology, tmp_path / "input", idle_timeout_s=2,
                      logs=tmp_path / "logs") as cluster:
        cluster.client.submit(stored)
        seen = set()
        for result in cluster.client.results("stored", timeout_s=180):
            seen.add(result.window_start)
            if len(seen) == len(live):
                break
        for size in ("10s", "1m"):
            past = tmp_path / f"past-{size}.py"
            past.write_text(HISTORY_FILE.replace("SIZE", repr(size)))
            want = js.run_local(load_query(past), tmp_path / "input")
            deadline = time.monotonic() + 60  # the sites roll their windows up every 10 s
            while True:
                response = cluster.client.history(past, base - MINUTE, now)
                got = [result_from_proto(r) for r in response.results]
                if [(r.window_start, r.rows) for r in got] == [
                        (r.window_start, r.rows) for r in want] or time.monotonic() > deadline:
                    break
                time.sleep(2)
            assert [(r.window_start, r.rows) for r in got] == [
                (r.window_start, r.rows) for r in want], size
            assert all(r.history and r.exact and r.sites_reporting == 3 for r in got)
            assert response.stored == "stored" and response.bytes > 0
            assert response.resolution_ms == (10_000 if size == "10s" else MINUTE)
        # The same from the command line, as JSON lines.
        from jetstream.cli import main

        capsys.readouterr()
        assert main(["history", "--query", str(past), "--since", str(base - MINUTE),
                     "--until", str(now), "--json", "--controller", cluster.address,
                     "--tls-dir", str(cluster.tls_dir)]) == 0
        printed = capsys.readouterr()
        assert [json.loads(line) for line in printed.out.splitlines()] == [
            r.to_dict() for r in got]
        assert "from the 60 s cubes of stored; the sites sent" in printed.err

        # Backfill, then live: a new query starts with the past from the cubes, up to the end
        # of the stored query's newest complete window, and counts the records from there.
        seam = base + 2 * MINUTE
        later = tmp_path / "later.py"
        later.write_text(HISTORY_FILE.replace("SIZE", "'1m'").replace('"past"', '"later"'))
        submitted = cluster.client.submit(later, since_ms=base - MINUTE)
        assert f"live from {seam}" in submitted.backfill, submitted.backfill
        # A query deployed on a live site reads from where the site is then: the records
        # after the seam land once it is deployed.
        cluster.wait_for_stages("later")
        for site in SITES:  # records after the seam, read by both queries
            rows = sorted((log(seam + rng.randrange(40_000), f"d{rng.randrange(5)}.com",
                               pop=site, cache=rng.choice(["HIT", "MISS"]))
                           for _ in range(100)), key=lambda r: r["ts"])
            staged = tmp_path / f"{site}-1.csv"
            staged.write_text(",".join(names) + "\n" + "".join(
                ",".join(str(r[n]) for n in names) + "\n" for r in rows))
            staged.rename(tmp_path / "input" / site / "part-1.csv")
        want = js.run_local(load_query(later), tmp_path / "input")
        got_later: dict[int, Any] = {}
        for result in cluster.client.results("later", timeout_s=120):
            got_later[result.window_start] = result
            if len(got_later) == len(want) and got_later[seam].sites_reporting == 3:
                break
    assert [(r.window_start, r.rows) for r in want] == [
        (w, got_later[w].rows) for w in sorted(got_later)]
    assert [got_later[w].history for w in sorted(got_later)] == [True, True, False]


def test_history_times_are_durations_ago_iso_times_or_epoch_ms() -> None:
    from jetstream.cli.operate import parse_time

    now = 1_795_520_000_000
    assert parse_time("1h", now, "--since") == now - HOUR
    assert parse_time("2026-11-24T10:00:00Z", now, "--since") == 1_795_514_400_000
    assert parse_time("2026-11-24T10:00:00", now, "--since") == 1_795_514_400_000  # UTC
    assert parse_time("1795514400000", now, "--until") == 1_795_514_400_000
    with pytest.raises(PlanError, match="--since 'yesterday': give a duration ago"):
        parse_time("yesterday", now, "--since")


def test_a_backfilled_query_runs_live_from_the_seam_and_takes_tumbling_windows_only() -> None:
    from jetstream.dataplane.history import seamed

    query = history(kept(LOGS).window(js.tumbling("1m")).group_by("domain")
                    .agg(n=js.count()))
    records = [log(t, "a.com") for t in range(0, 4 * MINUTE, 7_000)]
    live = js.run_local(seamed(query, 2 * MINUTE), records)
    assert [r.window_start for r in live] == [2 * MINUTE, 3 * MINUTE]
    assert live == [r for r in js.run_local(query, records) if r.window_start >= 2 * MINUTE]
    sliding = history(kept(LOGS).window(js.sliding("1m", every="10s")).agg(n=js.count()))
    with pytest.raises(PlanError, match="a backfill takes a tumbling window"):
        seamed(sliding, 2 * MINUTE)
    with pytest.raises(PlanError, match="is not at a window's start"):
        seamed(query, 2 * MINUTE + 1)


# -- over thin links: a site's answer steps down the stored query's ladder ------------------

def stored_windows(folder: Path, records: dict[str, list[dict[str, Any]]]
                   ) -> dict[str, list[Any]]:
    """Each site's own 10 s windows of STORED, as its cube store keeps them (messages)."""
    site_query, partial = site_part(distributed(STORED))
    out = {}
    for site, rows in records.items():
        with CubeStore(folder / f"{site}.sqlite") as store:
            for result in js.run_local(site_query, rows):
                store.receive(encode_batch(PartialBatch(
                    "cdn", (result.window_start, result.window_end), site,
                    tuple(result.rows)), partial))
            out[site] = store.messages("cdn", 0, 2 * NOW, None, [site])
    return out


def busy_records(seed: int, domains: int, ips: int, n: int) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) ** 1.1 for i in range(domains)]
    return {site: sorted((log(NOW - 20 * MINUTE + rng.randrange(MINUTE),
                              f"d{rng.choices(range(domains), weights)[0]}.com", pop=site,
                              cache=rng.choice(["HIT", "MISS"]), bytes=rng.randrange(1 << 20),
                              client_ip=f"10.{rng.randrange(ips) // 65536}."
                                        f"{rng.randrange(ips) // 256 % 256}.{rng.randrange(256)}")
                          for _ in range(n)), key=lambda r: r["ts"]) for site in SITES}


def thin_answers(tmp_path: Path, query: js.Query, records: dict[str, list[dict[str, Any]]]
                 ) -> tuple[Any, list[Any]]:
    """Each site's answer to ``query`` over a link that carries a twelfth of it, read back."""
    from jetstream.dataplane.history import degraded_answer

    how = plan(query)
    stored = distributed(STORED)
    kept_windows = stored_windows(tmp_path, records)
    full = sum(m.ByteSize() for ms in kept_windows.values() for m in ms)
    _, partial = site_part(stored)
    sent = {site: degraded_answer(ms, stored, full // 12, how.max_level)
            for site, ms in kept_windows.items()}
    assert sum(m.ByteSize() for ms in sent.values() for m in ms) < full
    batches = [decode_batch(m, partial) for ms in sent.values() for m in ms]
    assert all(b.level > 0 for b in batches)
    (result,) = how.finish(batches, expected=SITES, unanswered={})
    return how, [result, js.run_local(query, sorted(
        (r for rows in records.values() for r in rows), key=lambda r: r["ts"]))[0]]


@pytest.mark.parametrize("seed", range(2))
def test_with_fewer_keys_a_thin_link_sends_sketches_and_the_bounds_hold(
        tmp_path: Path, seed: int) -> None:
    """Fewer keys than the stored ones: only the sketch levels may go (they merge whatever
    the keys), here HLL sketches of the large sets of client addresses."""
    users = history(kept(LOGS).window(js.tumbling("1m")).group_by("domain")
                    .agg(n=js.count(), users=js.count_distinct("client_ip")))
    how, (result, want) = thin_answers(tmp_path, users, busy_records(seed, 2, 1 << 20, 12_000))
    assert how.ladder.levels[how.max_level].name == "HLL 2^12"
    assert not result.exact and 0 < result.error_bound < 0.1
    truth = {r["domain"]: r for r in want.rows}
    for row in result.rows:
        assert row["n"] == truth[row["domain"]]["n"]
        true_users = truth[row["domain"]]["users"]
        assert abs(row["users"] - true_users) <= result.error_bound * row["users"] + 1


@pytest.mark.parametrize("seed", range(2))
def test_with_the_stored_keys_and_ranking_a_thin_link_truncates_with_top_k_bounds(
        tmp_path: Path, seed: int) -> None:
    top = history(kept(LOGS).window(js.tumbling("1m")).group_by("domain", "cache")
                  .agg(n=js.count()).top_k(5, by="n"))
    records = busy_records(seed, 200, 1 << 10, 3000)
    how, (result, want) = thin_answers(tmp_path, top, records)
    assert how.ladder.levels[how.max_level].name == "top 20, HLL 2^12"
    assert not result.exact and len(result.rows) == 5
    counts: dict[tuple[str, str], int] = {}
    for rows in records.values():
        for r in rows:
            if r["status"] < 500:
                key = (r["domain"], r["cache"])
                counts[key] = counts.get(key, 0) + 1
    kth = want.rows[-1]["n"]
    for row in result.rows:
        true = counts[(row["domain"], row["cache"])]
        assert row["lb"] <= true <= row["ub"], row
        if row["guaranteed"]:
            assert true >= kth


def test_a_filter_on_a_key_a_stored_step_changes_and_a_map_are_refused() -> None:
    bumped = js.Query("bumped", LOGS.with_column("status", col("status") + 1)
                      .window(js.tumbling("10s")).group_by("status").agg(n=js.count()))
    asked = history(LOGS.where(col("status") == 404).with_column("status", col("status") + 1)
                    .window(js.tumbling("1m")).group_by("status").agg(n=js.count()))
    with pytest.raises(PlanError, match="differ at `where status == 404`"):
        plan_history(asked, [bumped], since_ms=NOW - HOUR, until_ms=NOW, now_ms=NOW)
    mapped = js.Query("mapped", LOGS.map(lambda r: r, name="same").window(js.tumbling("10s"))
                      .agg(n=js.count()))
    with pytest.raises(PlanError, match="history cannot tell one map function from another"):
        plan_history(history(LOGS.map(lambda r: r, name="same").window(js.tumbling("1m"))
                             .agg(n=js.count())), [mapped], since_ms=NOW - HOUR,
                     until_ms=NOW, now_ms=NOW)


def test_a_site_refuses_a_resolution_or_a_range_it_does_not_keep(tmp_path: Path) -> None:
    from jetstream.aggtree.topology import Server
    from jetstream.control.site_controller import SiteController
    from jetstream.dataplane.options import SiteOptions
    from jetstream.dataplane.site import SiteRuntime
    from jetstream.errors import ControlPlaneError
    from jetstream.planwire import query_to_proto
    from jetstream.v1 import control_pb2

    runtime = SiteRuntime("ams", SiteOptions(cubes=True, state_dir=tmp_path,
                                             retention={10_000: 3600.0}), lambda *_: None)
    try:
        site = SiteController("ams", [Server("ams-1", 1, 1.0)], runtime)
        now = time.time_ns() // 1_000_000
        request = control_pb2.ReadCubesRequest(query="cdn", start_ms=now - 10 * MINUTE,
                                               end_ms=now, resolution_ms=MINUTE,
                                               stored=query_to_proto(STORED))
        with pytest.raises(ControlPlaneError, match="site ams keeps no 60 s rollups"):
            site.read_cubes(request)
        request.resolution_ms, request.start_ms = 0, now - 3 * HOUR
        with pytest.raises(ControlPlaneError, match="keeps its 10 s windows for 3600 s"):
            site.read_cubes(request)
    finally:
        runtime.close()
