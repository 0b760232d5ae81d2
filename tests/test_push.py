"""Logs pushed to a site over HTTP (jetstream.stage.push): NDJSON bodies, gzip or not, spooled
into the site's folder as whole files and answered 200 only once on disk; retried requests
with an idempotency key taken once; a full spool pushes back; bad requests refused."""

from __future__ import annotations

import csv
import gzip
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jetstream as js
from jetstream.control.launch import LocalCluster, free_port
from jetstream.queryfile import load_query
from jetstream.stage.push import PushServer, Spool, serve_push
from tests.conftest import log

TOKEN = "s3cret"


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    made = Spool(tmp_path / "in", tmp_path / "push", site="ams", roll_s=0.2)
    yield made
    made.close()


@pytest.fixture
def server(spool: Spool) -> Iterator[PushServer]:
    made = serve_push(("127.0.0.1", 0), spool, token=TOKEN, max_request_bytes=1 << 16)
    yield made
    made.shutdown()
    made.server_close()


def post(server: PushServer, body: bytes, **headers: str) -> tuple[int, dict[str, Any]]:
    host, port = server.server_address[:2]
    request = urllib.request.Request(
        f"http://{host}:{port}/logs", data=body, method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, {**json.loads(e.read()), "retry_after": e.headers.get("Retry-After")}


def ndjson(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def spooled(folder: Path) -> list[str]:
    """The lines of the files the spool made, in file order; no file half-written."""
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]
    return [line for p in sorted(folder.glob("push-*.jsonl"))
            for line in p.read_text().splitlines()]


def test_a_push_is_answered_once_it_is_on_disk_and_the_site_reads_it_as_run_local_does(
        server: PushServer, spool: Spool) -> None:
    records = [log(1_000 * i, f"d{i % 3}.com") for i in range(30)]
    assert post(server, ndjson(records[:10])) == (
        200, {"accepted": 10, "malformed": 0, "duplicate": False})
    assert len(spooled(spool.folder)) == 10  # on disk when the answer came
    # Two gzip members (what some shippers send), and a blank line that is no line.
    body = gzip.compress(ndjson(records[10:20])) + gzip.compress(ndjson(records[20:]) + b"\n")
    assert post(server, body, **{"Content-Encoding": "gzip"})[1]["accepted"] == 20
    source = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA, format="json")
    query = js.Query("pushed", source.window(js.tumbling("10s")).group_by("domain")
                     .agg(n=js.count()))
    assert js.run_local(query, spool.folder) == js.run_local(query, records)


def test_requests_in_flight_together_share_a_file(server: PushServer, spool: Spool) -> None:
    answers: list[int] = []
    threads = [threading.Thread(target=lambda i=i: answers.append(
        post(server, ndjson([log(i, "a.com")]))[0])) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [200] * 8
    assert len(spooled(spool.folder)) == 8
    assert len(list(spool.folder.glob("push-*.jsonl"))) < 8


def test_a_retried_request_with_its_key_is_taken_once_even_after_a_restart(
        server: PushServer, spool: Spool, tmp_path: Path) -> None:
    body = ndjson([log(1, "a.com"), log(2, "b.com")])
    assert post(server, body, **{"Idempotency-Key": "batch-1"})[1]["duplicate"] is False
    assert post(server, body, **{"Idempotency-Key": "batch-1"})[1] == {
        "accepted": 2, "malformed": 0, "duplicate": True}
    assert post(server, body, **{"Idempotency-Key": "batch-2"})[1]["duplicate"] is False
    assert len(spooled(spool.folder)) == 4
    again = Spool(spool.folder, tmp_path / "push", roll_s=0.2)  # the site started again
    try:
        assert again.put(body, "batch-1") is None and again.put(body, "batch-2") is None
    finally:
        again.close()
    assert len(spooled(spool.folder)) == 4


def test_malformed_lines_are_counted_and_spooled_for_the_stage_to_set_aside(
        server: PushServer, spool: Spool) -> None:
    status, answer = post(server, b'{"ts": 1}\nnot json\n[1, 2]\n')
    assert (status, answer["accepted"], answer["malformed"]) == (200, 3, 2)
    assert spooled(spool.folder) == ['{"ts": 1}', "not json", "[1, 2]"]


def test_bad_requests_are_refused_and_nothing_of_them_is_taken(
        server: PushServer, spool: Spool) -> None:
    host, port = server.server_address[:2]
    anonymous = urllib.request.Request(f"http://{host}:{port}/", data=b"{}\n", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=30)
    assert refused.value.code == 401
    assert post(server, b"x" * (1 << 17))[0] == 413  # over max_request_bytes
    bomb = gzip.compress(b"{}\n" * (1 << 16))  # small, but too large once decompressed
    assert post(server, bomb, **{"Content-Encoding": "gzip"})[0] == 413
    assert post(server, b"no gzip", **{"Content-Encoding": "gzip"})[0] == 400
    assert spooled(spool.folder) == []


def test_a_full_spool_answers_429_and_takes_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "in", tmp_path / "push", roll_s=60, max_pending_bytes=100)
    server = serve_push(("127.0.0.1", 0), spool, token=TOKEN, wait_s=0.5)
    try:
        assert post(server, b"{}\n" * 30)[0] == 503  # taken, but not on disk within wait_s
        status, answer = post(server, b"{}\n" * 30)  # 180 bytes would wait: over 100
        assert (status, answer["retry_after"]) == (429, "60")
        assert "at most 100" in answer["error"]
    finally:
        server.shutdown()
        server.server_close()
        spool.close()
    assert spooled(tmp_path / "in") == ["{}"] * 30  # the first, written at close


# --- real processes: sites taking pushes, one killed mid-stream ---------------------------------

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "local-3dc.yaml"
PUSHED_QUERY = """
import jetstream as js
logs = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA, format="json")
query = js.Query("pushed", logs.window(js.tumbling("10s"), watermark="2s")
                 .group_by("domain").agg(requests=js.count(), kb=js.sum("bytes")))
"""


def push_until_taken(port: int, body: bytes, key: str, timeout_s: float = 120) -> bool:
    """POST ``body`` with ``key`` until a 200 (a site down, 503 or 429: again); whether the
    site called it a duplicate."""
    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body,
                                         method="POST", headers={"Idempotency-Key": key})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return bool(json.loads(answer.read())["duplicate"])
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            assert time.monotonic() < deadline, f"{key} not taken in {timeout_s}s"
            time.sleep(0.3)


def test_pushes_to_live_sites_with_one_killed_and_restarted_lose_and_double_nothing(
        tmp_path: Path) -> None:
    """sfo and sin take the sample logs as keyed pushes of 40 lines; sfo is killed with
    SIGKILL half way and started again, a push of it in flight is sent again until taken,
    and its last push before the kill is sent again after (its answer, say, was lost): the
    windows equal run_local over every acknowledged record once."""
    logs = ROOT / "examples" / "logs"
    ports = {site: free_port() for site in ("ams", "sfo", "sin")}
    for site in ports:
        (tmp_path / "input" / site).mkdir(parents=True)
    query = tmp_path / "pushed.py"
    query.write_text(PUSHED_QUERY)
    batches: dict[str, list[list[dict[str, Any]]]] = {site: [] for site in ("sfo", "sin")}
    taken: dict[str, list[dict[str, Any]]] = {site: [] for site in batches}  # in order
    for site in batches:
        rows = [r for r in csv_rows(logs / site / "part-000.csv")]
        batches[site] = [rows[i:i + 40] for i in range(0, len(rows), 40)]
    with LocalCluster(TOPOLOGY, tmp_path / "input", idle_timeout_s=3,
                      logs=tmp_path / "logs", site_args=lambda s: [
                          "--push-http", f"127.0.0.1:{ports[s]}", "--push-roll", "0.2",
                          "--warm-up", "0"]) as cluster:
        cluster.client.submit(query)
        cluster.wait_for_stages("pushed")
        half = len(batches["sfo"]) // 2
        for i in range(max(map(len, batches.values()))):
            for site, chunks in batches.items():
                if i >= len(chunks):
                    continue
                body, key = ndjson(chunks[i]), f"{site}-{i}"
                if site == "sfo" and i == half:  # killed with a push in flight
                    inflight = threading.Thread(target=push_until_taken,
                                                args=(ports[site], body, key))
                    inflight.start()
                    time.sleep(0.1)
                    cluster.kill("sfo")  # what it had not made durable is lost, and unanswered
                    cluster.restart("sfo")
                    inflight.join()  # sent again until taken (a duplicate if it was on disk)
                else:
                    assert not push_until_taken(ports[site], body, key)
                taken[site].extend(chunks[i])
                if site == "sfo" and i == half:  # its last push before the kill, again
                    assert push_until_taken(ports[site], ndjson(batches["sfo"][half - 1]),
                                            f"sfo-{half - 1}")
        # The reference over what was acknowledged, a stream per site as the sites read it.
        for site, records in taken.items():
            (tmp_path / "taken" / site).mkdir(parents=True)
            (tmp_path / "taken" / site / "all.jsonl").write_bytes(ndjson(records))
        want = {(r.window_start, r.window_end): r.rows
                for r in js.run_local(load_query(query), tmp_path / "taken")}
        got: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for result in cluster.client.results("pushed", timeout_s=180):
            got[(result.window_start, result.window_end)] = result.rows
            if got == want:
                break
    assert got == want
    pushed = sum(1 for p in (tmp_path / "input" / "sfo").glob("push-*.jsonl")
                 for _ in p.read_text().splitlines())
    assert pushed == sum(map(len, batches["sfo"]))  # each line on disk once


def csv_rows(path: Path) -> list[dict[str, Any]]:
    """A sample CSV file's well-formed rows, typed as a JSON object holds them."""
    ints = {f.name for f in js.CDN_LOG_SCHEMA if f.dtype.value == "int"}
    floats = {f.name for f in js.CDN_LOG_SCHEMA if f.dtype.value == "float"}
    with path.open(newline="") as fh:
        return [{k: int(v) if k in ints else float(v) if k in floats else v
                 for k, v in row.items()}
                for row in csv.DictReader(fh) if None not in row.values()]
