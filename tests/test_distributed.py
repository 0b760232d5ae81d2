"""The full distributed path against the reference executor: a controller and three site
processes on local-3dc, each site's local stage in its own Spark JVM, partials over gRPC, the
final step at the root; and the root's data plane fed duplicated and resent batches."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jetstream.aggtree.planner import Fragment
from jetstream.cli import main
from jetstream.control.launch import LocalCluster, replay
from jetstream.control.server import start_server
from jetstream.dataplane.codec import encode_batch
from jetstream.dataplane.options import Assignment, SiteOptions
from jetstream.dataplane.partials import PartialBatch
from jetstream.dataplane.site import SiteRuntime
from jetstream.dataplane.transport import PartialSender
from jetstream.errors import ControlPlaneError
from jetstream.local import run_local
from jetstream.queryfile import load_query, query_from_source
from jetstream.results import WindowResult
from jetstream.v1 import dataplane_pb2 as pb
from jetstream.v1 import dataplane_pb2_grpc as rpc
from tests.conftest import log, spec_of
from tests.test_merger import site_batches, split

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "examples" / "logs"
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"

HEADER = "import jetstream as js\nfrom jetstream import col\n" \
         "logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)\n"
QUERIES = {
    "sum": "logs.window(js.tumbling('10s'), watermark='5s').group_by('pop')"
           ".agg(bytes=js.sum('bytes'), kb=js.sum(col('bytes') / 1024))",
    "avg": "logs.where(col('cache') == 'HIT').window(js.tumbling('20s'), watermark='5s')"
           ".group_by('domain').agg(mean=js.avg('latency_ms'), n=js.count())",
    "distinct": "logs.window(js.tumbling('10s'), watermark='5s').group_by('status')"
                ".agg(clients=js.count_distinct('client_ip'), p90=js.quantile('latency_ms', 0.9))",
    "sliding": "logs.window(js.sliding('20s', every='5s'), watermark='5s').group_by('domain')"
               ".agg(n=js.count(), slowest=js.max('latency_ms')).top_k(3, by='n')",
}


def query_file(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(f"{HEADER}query = js.Query({name!r}, {body})\n")
    return path


def assert_same(got: list[WindowResult], want: list[WindowResult]) -> None:
    assert [(r.window_start, r.window_end) for r in got] == [
        (r.window_start, r.window_end) for r in want]
    for g, w in zip(got, want, strict=True):
        assert (g.rows, g.exact) == (w.rows, w.exact), f"window {g.window_start}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(TOPOLOGY, LOGS, replay=True, window_deadline_s=120,
                      logs=tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_replay_equals_the_reference_window_by_window(cluster: LocalCluster, tmp_path: Path,
                                                      name: str) -> None:
    path = query_file(tmp_path, name, QUERIES[name])
    got = replay(cluster, path, timeout_s=240)
    want = run_local(load_query(path), LOGS)
    assert len(want) >= 3
    assert_same(got, want)
    for result in got:
        assert (result.sites_reporting, result.sites_expected) == (3, 3)
        assert result.wan_bytes and result.wan_bytes > 0
        assert result.latency_s is not None and result.latency_s >= 0


def test_jetstream_run_writes_what_run_local_computes(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    query = ROOT / "examples" / "cdn_topk.py"
    done = subprocess.run(
        [sys.executable, "-m", "jetstream", "run", "--topology", str(TOPOLOGY),
         "--query", str(query), "--input", str(LOGS), "--output", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "every one final" in done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    want = run_local(load_query(query), LOGS)
    assert [(r["window_start"], r["rows"]) for r in lines] == [
        (r.window_start, r.rows) for r in want]
    for line in lines:
        assert {"query", "window_start", "window_end", "rows", "exact", "error_bound",
                "sites_reporting", "sites_expected", "latency_s", "wan_bytes"} <= set(line)
        assert line["sites_reporting"] == line["sites_expected"] == 3


JOIN_QUERY = """\
import jetstream as js
from jetstream import col
from pathlib import Path

with open(Path(__file__).parent / "runs.txt", "a") as runs:  # count the file's runs
    runs.write("ran\\n")

customers = js.table("customers", "customers.csv", schema=js.Schema.of({
    "domain": js.DataType.STRING, "customer": js.DataType.STRING,
    "tier": js.DataType.STRING}))


def slow_share(record):
    return {**record, "slow": record["latency_ms"] > 20.0}


logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
query = js.Query("joined", logs.join(customers, on="domain", how=HOW)
                 .where(col("tier") != "bronze")
                 .map(slow_share, schema={**dict((f.name, f.dtype) for f in logs.schema),
                                          "customer": js.DataType.STRING,
                                          "tier": js.DataType.STRING,
                                          "slow": js.DataType.BOOL}, name="slow_share")
                 .window(js.tumbling("10s"), watermark="5s")
                 .group_by("customer", "slow").agg(n=js.count(), kb=js.sum(col("bytes") / 1024))
                 .top_k(4, by="n"))
"""
CUSTOMERS = ("domain,customer,tier\n" + "".join(
    f"site{i}.example.com,customer{i % 4},{('gold', 'silver', 'bronze')[i % 3]}\n"
    for i in range(1, 20)))


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_join_and_a_map_run_at_the_sites_as_in_the_reference(tmp_path: Path, how: str) -> None:
    """A lookup join, a filter on the table's columns and a map, through `jetstream run`: the
    same answer as the reference, and the query file ran once (on the user's side)."""
    (tmp_path / "customers.csv").write_text(CUSTOMERS)
    path = tmp_path / "joined.py"
    path.write_text(JOIN_QUERY.replace("HOW", repr(how)))
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "jetstream", "run", "--topology", str(TOPOLOGY),
         "--query", str(path), "--input", str(LOGS), "--output", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path.parent)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs.txt").read_text() == "ran\n"  # not at the controller or sites
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    want = run_local(load_query(path), LOGS)
    assert len(want) >= 3
    assert [(r["window_start"], r["rows"]) for r in lines] == [
        (r.window_start, r.rows) for r in want]


UNION_QUERY = HEADER + """\
origin = js.source("origin_logs", schema=js.CDN_LOG_SCHEMA)
query = js.Query("union", logs.where(col("status") < 400)
                 .union(origin.where(col("cache") == "MISS"), logs.where(col("status") >= 500))
                 .window(js.tumbling("10s"), watermark="5s")
                 .group_by("domain").agg(n=js.count(), kb=js.sum(col("bytes") / 1024))
                 .top_k(5, by="n"))
"""


def test_a_union_runs_a_stage_per_input_at_the_sites_as_in_the_reference(
        tmp_path: Path) -> None:
    """A union of two sources, one of them read twice: ams and sin hold both (each in its
    folder, ``<input>/<source>/``), sfo only cdn_logs; each site runs a stage per input of the
    union it holds, and the answer is the reference's."""
    topology = tmp_path / "two-sources.yaml"
    extra = ("      - {name: origin_logs, events_per_s: 50, bytes_per_event: 110, "
             "distinct_keys: 50}\n")
    text, sites = TOPOLOGY.read_text().split("  - name: "), []
    for part in text[1:]:
        if part.startswith(("ams", "sin")):
            part = part.replace("distinct_keys: 50}\n", "distinct_keys: 50}\n" + extra, 1)
        sites.append(part)
    topology.write_text("  - name: ".join([text[0], *sites]))
    by_source: dict[str, Path] = {}
    for source, held in (("cdn_logs", ("ams", "sfo", "sin")), ("origin_logs", ("ams", "sin"))):
        for site in held:
            lines = (LOGS / site / "part-000.csv").read_text().splitlines(keepends=True)
            half = lines[1::2] if source == "cdn_logs" else lines[2::2]  # both: every other
            for folder in (tmp_path / source / site, tmp_path / "input" / site / source):
                folder.mkdir(parents=True)
                (folder / "part-000.csv").write_text("".join(lines[:1] + half))
        by_source[source] = tmp_path / source
    path = tmp_path / "union.py"
    path.write_text(UNION_QUERY)
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "jetstream", "run", "--topology", str(topology),
         "--query", str(path), "--input", str(tmp_path / "input"), "--output", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    want = run_local(load_query(path), by_source)
    assert len(want) >= 3
    assert [(r["window_start"], r["rows"]) for r in lines] == [
        (r.window_start, r.rows) for r in want]
    # (The first window holds the few records stamped before the logs begin: not every
    # site's fell in the rows kept.)
    assert {(r["sites_reporting"], r["sites_expected"]) for r in lines[1:]} == {(3, 3)}
    assert not any(r["warnings"] for r in lines)


def test_a_stage_that_fails_at_the_sites_fails_jetstream_run(tmp_path: Path) -> None:
    """A map that raises on a record fails the sites' stages: `jetstream run` says so and
    exits with an error, instead of writing results that lack those sites' records."""
    path = tmp_path / "boom.py"
    path.write_text(f"{HEADER}\n"
                    "def boom(record):\n"
                    "    if record['domain'] == 'site4.example.com':\n"
                    "        raise ValueError('no site4')\n"
                    "    return record\n\n"
                    "query = js.Query('boom', logs.map(boom, name='boom')"
                    ".window(js.tumbling('10s'), watermark='5s').agg(n=js.count()))\n")
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "jetstream", "run", "--topology", str(TOPOLOGY),
         "--query", str(path), "--input", str(LOGS), "--output", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0, done.stderr
    assert "query boom: the local stage failed at 3 site(s)" in done.stderr
    assert "map boom: the function raised ValueError: no site4" in done.stderr
    assert not out.exists()


def test_live_sites_with_quiet_neighbours_still_close_their_windows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only ams has data, and it arrives as files while the query runs; sfo and sin stay
    quiet. The quiet sites must not hold the windows back, and ams's last window closes
    when its input goes idle."""
    inbox = tmp_path / "input" / "ams"
    inbox.mkdir(parents=True)
    path = query_file(tmp_path, "live", QUERIES["sum"])
    want = run_local(load_query(path), LOGS / "ams")
    with LocalCluster(TOPOLOGY, tmp_path / "input", idle_timeout_s=2,
                      logs=tmp_path / "logs") as cluster:
        cluster.client.submit(path)
        # ams's stage has warmed up and reads (the quiet sites, without a folder, read none).
        cluster.wait_for_stages("live")
        # An operator asks about sfo's link, through the controller to sfo's process.
        now = cluster.client.set_level("live", "sfo", "auto")
        # No top-k: a thin link would keep each window's heaviest pops by bytes.
        assert (now.link, now.level, now.pinned, list(now.levels)) == (
            "sfo -> ams", "exact", False,
            ["exact", "heaviest 1024", "heaviest 256", "heaviest 64"])
        with pytest.raises(ControlPlaneError, match="ams sends live over no link"):
            cluster.client.set_level("live", "ams")
        assert main(["level", "live", "sin", "--controller", cluster.address,
                     "--tls-dir", str(cluster.tls_dir)]) == 0
        assert capsys.readouterr().out == (
            "live: link sin -> ams at 'exact' (chosen by the link's policy)\nlevels: 0 'exact', "
            "1 'heaviest 1024', 2 'heaviest 256', 3 'heaviest 64'\n")
        lines = (LOGS / "ams" / "part-000.csv").read_text().splitlines(keepends=True)
        half = len(lines) // 2
        for i, chunk in enumerate([lines[:half], lines[:1] + lines[half:]]):
            staged = tmp_path / f"part-{i}.csv"
            staged.write_text("".join(chunk))
            staged.rename(inbox / staged.name)  # atomically, as a log shipper would
        got: dict[tuple[int, int], WindowResult] = {}
        for result in cluster.client.results("live", timeout_s=150):
            got[(result.window_start, result.window_end)] = result
            if len(got) == len(want):
                break
    assert_same([got[w] for w in sorted(got)], want)


def test_links_of_tput_rounds_held_at_a_truncation_and_a_sketch_send_bounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A top-5 on local-3dc, whose links into the root run TPUT's rounds: held by
    `jetstream level` at a truncation (sfo) and a sketch (sin), the windows with their
    records go out inexact, with bounds that hold each domain's true count, and none waits
    for its deadline (ten minutes here)."""
    body = ("logs.window(js.tumbling('10s'), watermark='5s').group_by('domain')"
            ".agg(requests=js.count(), kb=js.sum('bytes'))")
    path = query_file(tmp_path, "top5", f"{body}.top_k(5, by='requests')")
    counted = run_local(load_query(query_file(tmp_path, "counts", body)), LOGS)
    truth = {(r.window_start, row["domain"]): row["requests"] for r in counted for row in r.rows}
    busy = {r.window_start for r in counted if len(r.rows) > 20}  # every site's records
    want = {r.window_start: r for r in run_local(load_query(path), LOGS)}
    for site in ("ams", "sfo", "sin"):
        (tmp_path / "input" / site).mkdir(parents=True)
    with LocalCluster(TOPOLOGY, tmp_path / "input", idle_timeout_s=2, window_deadline_s=600,
                      logs=tmp_path / "logs") as cluster:
        assert "TPUT rounds" in cluster.client.submit(path).plan
        cluster.wait_for_stages("top5")
        for site, level in (("sfo", "top 10"), ("sin", "sketch of 12")):
            assert main(["level", "top5", site, level, "--controller", cluster.address,
                         "--tls-dir", str(cluster.tls_dir)]) == 0
            assert f"link {site} -> ams at {level!r} (pinned" in capsys.readouterr().out
        for site in ("ams", "sfo", "sin"):
            staged = tmp_path / f"{site}.csv"
            staged.write_text((LOGS / site / "part-000.csv").read_text())
            staged.rename(tmp_path / "input" / site / "part-000.csv")
        got: dict[int, WindowResult] = {}
        for result in cluster.client.results("top5", timeout_s=150):
            got[result.window_start] = result
            if set(got) >= set(want):
                break
    assert set(got) == set(want) and busy <= set(got)
    for start, result in sorted(got.items()):
        if result.exact:
            assert start not in busy and result.rows == want[start].rows
            continue
        assert result.error_bound is not None and len(result.rows) == 5
        for row in result.rows:
            assert row["lb"] <= truth[(start, row["domain"])] <= row["ub"], (start, row)


# -- the root's data plane over real gRPC, fed by senders that repeat and restart ------------

def events() -> list[dict[str, Any]]:
    return [log(1_000 * i + 17 * (i % 5), f"d{i % 4}.com", pop=site, bytes=100 * i,
                latency_ms=float(i % 9)) for i in range(60) for site in ("sfo", "sin")]


class Root:
    """A root site's runtime with its DataPlane server; published results are kept."""

    def __init__(self, source: str, name: str) -> None:
        self.results: list[WindowResult] = []
        self.finished = threading.Event()
        self.runtime = SiteRuntime("ams", SiteOptions(deadline_s=60), self._publish)
        self.server, self.port = start_server([(
            rpc.add_DataPlaneServicer_to_server, self.runtime.servicer,
            "jetstream.v1.DataPlane")], 0)
        self.runtime.deploy(Assignment(
            Fragment(name, "ams", children=("sfo", "sin"), final=True), spec_of(source),
            covers=("sfo", "sin")))

    def _publish(self, query: str, results: list[WindowResult], finished: bool) -> None:
        self.results += results
        if finished:
            self.finished.set()

    def final(self) -> list[WindowResult]:
        latest = {(r.window_start, r.window_end): r for r in self.results}
        return [latest[w] for w in sorted(latest)]

    def close(self) -> None:
        self.runtime.close()
        self.server.stop(grace=0).wait(5)


def test_duplicated_and_resent_batches_leave_the_results_unchanged() -> None:
    source = f"{HEADER}query = js.Query('q', {QUERIES['sliding']})\n"
    query = query_from_source(source, "<test>")
    _, site_query, partial = split(query)
    records = events()
    sent = {site: site_batches(site_query, partial, site,
                               [e for e in records if e["pop"] == site])
            for site in ("sfo", "sin")}
    root = Root(source, "q")
    address = f"127.0.0.1:{root.port}"
    try:
        # sfo sends every batch twice (a Spark retry), on two separate streams.
        twice = [PartialSender(address), PartialSender(address)]
        for sender in twice:
            for i, batch in enumerate(sent["sfo"]):
                sender.send(encode_batch(PartialBatch(
                    "q", batch.window, "sfo", batch.rows, sequence=i), partial))
            sender.send_progress(pb.Progress(query="q", origin="sfo", watermark_ms=0,
                                             ended=True, sequence=10_000))
        # sin's sender dies half way through; its successor sends everything again.
        half = len(sent["sin"]) // 2
        first = PartialSender(address)
        for i, batch in enumerate(sent["sin"][:half]):
            first.send(encode_batch(PartialBatch("q", batch.window, "sin", batch.rows,
                                                 sequence=i), partial))
        first.close()
        again = PartialSender(address)
        for i, batch in enumerate(sent["sin"]):
            again.send(encode_batch(PartialBatch("q", batch.window, "sin", batch.rows,
                                                 sequence=i, attempt=1), partial))
        again.send_progress(pb.Progress(query="q", origin="sin", watermark_ms=0, ended=True,
                                        sequence=10_000))
        assert root.finished.wait(30), root.results
        for sender in [*twice, again]:
            assert sender.flush(10)
            sender.close()
        assert_same(root.final(), run_local(query, records))
        assert all(r.revision == 0 for r in root.results)  # nothing needed correcting
        assert root.runtime.servicer.duplicates >= len(sent["sfo"])
    finally:
        root.close()


def test_waiting_for_the_stages_takes_a_stage_not_reported_yet_for_one_not_reading(
        tmp_path: Path) -> None:
    """From the deploy to the site's next heartbeat, the controller lists a site's local stage
    with no state: the wait goes on until every reader's stage says "running"."""
    from types import SimpleNamespace

    cluster = LocalCluster(TOPOLOGY, tmp_path / "input", logs=tmp_path / "logs")
    states = iter(["", "starting", "running"])
    asked: list[str] = []

    class Status:  # the controller's answer: every reader's stage in the same state
        def status(self) -> Any:
            state = asked[-1] if len(asked) >= 3 else next(states)
            asked.append(state)
            return SimpleNamespace(sites=[SimpleNamespace(name=site, placements=[
                SimpleNamespace(query="q", piece="local stage", state=state),
                SimpleNamespace(query="q", piece="merge", state="")]) for site in cluster.sites])

    cluster.client = Status()  # type: ignore[assignment]
    cluster.wait_for_stages("q", timeout_s=30)
    assert asked == ["", "starting", "running"]
