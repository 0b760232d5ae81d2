"""The lab's commands (``gen-logs``, ``demo``, ``emulate``, ``bench``), which the command
line finds through the ``jetstream.commands`` entry point: the product does not import the lab."""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from jetstream.aggtree.loader import load_topology
from jetstream.cli.common import (
    DEFAULT_TOPOLOGY,
    EXAMPLES,
    dashboard_port,
    live_options,
    live_query,
    numbers,
    positive_seconds,
    progress,
)
from jetstream.control.launch import LocalCluster, replay
from jetstream.control.results_view import render_window
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError, PlanError
from jetstream.queryfile import load_query
from jetstream.units import parse_bandwidth
from jetstream.windows import parse_duration

__all__ = ["register"]


def _gen_logs(args: argparse.Namespace) -> int:
    # Imported here so that only this command pays for loading numpy.
    import contextlib
    import threading
    import time

    from jetstream.lab.loggen import FlashCrowd, LogSpec, write_live, write_logs

    say = progress("gen-logs")
    sites = [s.name for s in load_topology(args.topology).sites_with("cdn_logs")]
    if not sites:
        msg = f"--topology {args.topology}: no site holds a cdn_logs source to write logs for"
        raise PlanError(msg)
    crowds = []
    for text in args.flash_crowd:
        m = re.fullmatch(r"([^@]+)@([^:]+):(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)", text)
        if not m:
            msg = (f"--flash-crowd {text!r}: write it DOMAIN@SITE:START-END in seconds from "
                   "the start, e.g. site500.example.com@sfo:10-40")
            raise PlanError(msg)
        crowds.append(FlashCrowd(m[1], m[2], float(m[3]), float(m[4])))
    shape = {"domains": args.domains, "zipf": args.zipf, "regional": args.regional}
    spec = LogSpec(**{k: v for k, v in shape.items() if v is not None},
                   flash_crowds=tuple(crowds))
    out, began = Path(args.out), time.perf_counter()

    if args.live:
        if args.start is not None or args.files != 1:
            msg = "--start and --files mean nothing with --live: live logs are stamped now"
            raise PlanError(msg)
        chunk_ms = parse_duration(args.chunk, "--chunk")
        chunks = (-(-parse_duration(args.duration, "--duration") // chunk_ms)
                  if args.duration else None)
        stop, total = threading.Event(), 0

        def on_chunk(index: int, records: int) -> None:
            nonlocal total
            total += records
            say(f"chunk {index}: {records:,} records ({records * 1000 / chunk_ms:,.0f}/s)")
            if chunks is not None and index + 1 >= chunks:
                stop.set()

        say(f"live logs for {', '.join(sites)} into {out}, {args.rate:g} records/s per site"
            + ("" if chunks else "; Ctrl-C stops"))
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a live run: no error
            write_live(out, sites, rate=args.rate, spec=spec, seed=args.seed,
                       chunk_s=chunk_ms / 1000, stop=stop, on_chunk=on_chunk)
    else:
        duration_ms = parse_duration(args.duration or "60s", "--duration")
        start_ms = int(time.time()) * 1000 if args.start is None else args.start
        per_site: dict[str, list[float]] = {}  # files, records, bytes
        mark = time.perf_counter()

        def on_file(path: Path, records: int) -> None:
            nonlocal mark
            done = per_site.setdefault(path.parent.name, [0, 0, 0])
            done[0], done[1], done[2] = done[0] + 1, done[1] + records, \
                done[2] + path.stat().st_size
            if done[0] == args.files:
                now = time.perf_counter()
                say(f"{path.parent.name}: {done[1]:,} records, {done[2] / 1e6:,.1f} MB in "
                    f"{now - mark:.2f}s")
                mark = now

        write_logs(out, sites, start_ms=start_ms, duration_s=duration_ms / 1000,
                   rate=args.rate, spec=spec, seed=args.seed, files=args.files,
                   on_file=on_file)
        total = sum(int(done[1]) for done in per_site.values())
    elapsed = time.perf_counter() - began
    say(f"{total:,} records for {len(sites)} sites in {out}, {elapsed:.2f}s: "
        f"{total / max(elapsed, 1e-9):,.0f} lines/s")
    return 0


def _demo(args: argparse.Namespace) -> int:
    began = time.monotonic()
    say = progress("demo")
    query = live_query(args)
    if args.replay:
        if args.edge:
            raise ControlPlaneError("--edge and --replay: the replay reads the sample logs; "
                                    "give one of them")
        return _replay_demo(query, EXAMPLES / "logs", say)
    from jetstream.lab.demo import live_demo
    from jetstream.lab.edge import edge_missing
    from jetstream.lab.loggen import LogSpec

    if args.edge and (missing := edge_missing()):
        raise ControlPlaneError(f"--edge nginx: {missing}; or leave --edge out to run the "
                                "demo on generated logs")
    work = Path(tempfile.mkdtemp(prefix="jetstream-demo-"))
    logs = ("the access logs of a real nginx at each site, sent by rsyslog" if args.edge
            else "live generated CDN logs")
    say(f"the {query.name} query across the sites of {Path(args.topology).stem}, on {logs}; "
        f"it shows complete windows (every site reporting, wholly after the logs began) "
        + (f"for {args.duration:g}s from the first one" if args.duration else "until Ctrl-C"))
    dashboard = dashboard_port(args, "127.0.0.1", say)
    summary = live_demo(Path(args.topology), query, work, rate=args.rate,
                        duration_s=args.duration or None, spec=LogSpec(), seed=args.seed,
                        say=say, console=Console(),
                        cluster_options={"dashboard_port": dashboard}, edge=bool(args.edge))
    if summary.feed_start_ms:
        began_utc = datetime.fromtimestamp(summary.feed_start_ms / 1000, UTC)
        say(f"the log feed began at {began_utc:%H:%M:%S}.{began_utc.microsecond // 1000:03d} "
            "UTC; windows that open before it are not shown")
    if summary.first_complete_s is not None:
        say(f"the first complete window came {summary.first_complete_s:.0f}s after the query "
            f"was submitted, {(summary.first_complete_at or began) - began:.0f}s after the demo "
            "started")
    say(summary.savings())
    say(f"{len(summary.windows)} complete windows shown ({len(summary.not_shown)} partial "
        f"ones not); logs and state in {work}")
    return 0


def _replay_demo(query: Query, logs: Path, say: Callable[[str], None]) -> int:
    if not logs.is_dir():
        msg = f"the replay demo needs the sample logs of a source checkout ({logs})"
        raise PlanError(msg)
    say("the CDN top-k query across the three sites of local-3dc, replaying the sample logs")
    with LocalCluster(DEFAULT_TOPOLOGY, logs, replay=True, window_deadline_s=120,
                      say=say) as cluster:
        results = replay(cluster, query, timeout_s=600, say=say)
    console = Console()
    for result in results:
        console.print(render_window(result))
    root = load_topology(DEFAULT_TOPOLOGY).root
    raw = sum(f.stat().st_size for f in logs.glob("*/*.csv") if f.parent.name != root)
    wan = sum(r.wan_bytes or 0 for r in results)
    say(f"{wan:,} bytes of partials crossed the wide area, where shipping the other sites' "
        f"raw logs would take {raw:,}")
    return 0


def _emulate(args: argparse.Namespace) -> int:
    from jetstream.lab.demo import live_demo
    from jetstream.lab.emulate import HOST_ADDRESS, EmulatedSite, WideArea
    from jetstream.lab.loggen import LogSpec

    action, *rest = args.action
    WideArea.check_host()
    if action == "down":
        WideArea(load_topology(args.topology)).down()
        print("removed every js-* namespace and link")
        return 0
    if action == "set-link":
        if len(rest) != 3:
            msg = "usage: jetstream emulate set-link SITE_A SITE_B BANDWIDTH (e.g. 2mbit)"
            raise PlanError(msg)
        print(WideArea.running(load_topology(args.topology)).set_link(*rest))
        return 0
    if rest:
        msg = f"jetstream emulate {action}: unexpected {' '.join(rest)}"
        raise PlanError(msg)
    say = progress("emulate")
    topology_file = Path(action)
    area = WideArea(load_topology(topology_file))
    query = live_query(args)
    say(f"making a network namespace per site of {area.topology.name} and shaping each "
        "site's link to its parent with tc tbf")

    def made(site: EmulatedSite, n: int) -> None:
        shaped = (f"{site.uplink_bps / 1e6:g} Mbit/s to {site.parent}" if site.uplink_bps
                  else "unshaped (root)")
        say(f"  [{n}/{len(area.sites)}] {site.name}: {site.namespace}, {site.address}, "
            f"{shaped}")

    area.up(made)
    try:
        say(f"change a link while it runs: jetstream emulate set-link SITE PARENT 2mbit "
            f"--topology {topology_file}")
        work = Path(tempfile.mkdtemp(prefix="jetstream-emulate-"))
        dashboard = dashboard_port(args, HOST_ADDRESS, say)
        summary = live_demo(
            topology_file, query, work, rate=args.rate, duration_s=args.duration or None,
            spec=LogSpec(), seed=args.seed, say=say, console=Console(),
            cluster_options={"host": HOST_ADDRESS, "dashboard_port": dashboard,
                             "site_host": lambda s: area.sites[s].address,
                             "site_prefix": area.prefix})
        say(summary.savings())
    finally:
        area.down()
        say("removed the namespaces and links")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from jetstream.lab.bench import run_bench

    say = progress("bench")
    if args.load:
        return _bench_load(args, say)
    if (args.only or args.recover) and not args.emulate:
        msg = ("bench: --only and --recover shape the latency part, which runs only with "
               "--emulate; add --emulate, or drop them")
        raise PlanError(msg)
    if args.emulate:
        from jetstream.lab.emulate import WideArea

        WideArea.check_host()
        parse_bandwidth(args.link, "--link")
    duration, rate = (30.0, 100.0) if args.quick else (args.duration, args.rate)
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="jetstream-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    query = load_query(EXAMPLES / "cdn_topk.py")
    report = run_bench(Path(args.topology), query, work,
                       duration_s=duration, rate=rate, seed=args.seed, say=say)
    if args.emulate:
        from jetstream.lab.latency_bench import (
            DEFAULT_SYSTEMS,
            SYSTEMS,
            run_latency,
            seconds_text,
        )

        report["latency"] = run_latency(
            Path(args.topology), query, work,
            phase_s=args.phase if args.phase is not None else duration / 2,
            rate=args.live_rate, link=args.link, seed=args.seed, say=say,
            systems=args.only or DEFAULT_SYSTEMS, recover=args.recover)
        (work / "bench.json").write_text(json.dumps(report, indent=2))
    total = report["total"]
    say(f"wide-area bytes: JetStream-py {total['jetstream_bytes']:,}, backhaul (gzip) "
        f"{total['backhaul_bytes']:,}, raw {total['raw_bytes']:,}: "
        f"{total['jetstream_vs_backhaul'] or 0:,.1f}x fewer than the backhaul; the lower "
        f"bound (each edge site's top k rows a window) {total['lower_bound_bytes']:,}: "
        f"JetStream-py at {total['jetstream_over_lower_bound'] or 0:,.1f}x it")
    say(f"jetstream: {total['jetstream_windows_exact']} of {len(report['windows'])} windows "
        "came out exact")
    for system in ("jetstream", "backhaul"):
        say(f"{system}: top-10 recall {total[f'{system}_min_recall']}, largest count error "
            f"{total[f'{system}_max_error']} (worst window), windows never given: "
            f"{total[f'{system}_windows_missing']}")
    speed = report["throughput_records_per_s"]
    say(f"records/s: JetStream local stage {speed['jetstream_local_stage']:,.0f}, backhaul "
        f"Spark job {speed['backhaul_spark_job']:,.0f}")
    plots = "bytes.png"
    if args.emulate:
        latency = report["latency"]
        back = f", then {latency['link']} again" if latency["recover_at_s"] else ""
        say(f"latency over {latency['link']} for {latency['phase_s']:g}s, then "
            f"{latency['dropped_to']} for {latency['phase_s']:g}s{back} (p50 / p95 / p99, "
            "windows counted; a window closes when the last site receives the record that "
            "moves its watermark past the window's end)")
        for system in (s for s in SYSTEMS if s in latency):
            figures = latency[system]
            for measure, what in (("after_close", "after close"),
                                  ("after_end", "after window end"),
                                  ("reported", "results' own latency_s")):
                if measure not in figures:
                    continue
                parts = "; ".join(
                    f"{part.replace('_', ' ')} " + " / ".join(
                        seconds_text(figures[measure][part][f"p{q}_s"]) for q in (50, 95, 99))
                    + f" ({figures[measure][part]['windows']})"
                    for part in figures[measure] if part != "all")
                say(f"{system} {what}: {parts}")
            inexact = ("" if figures["windows_inexact"] is None
                       else f", {figures['windows_inexact']} marked inexact (largest error "
                       f"stated {figures['max_error_bound_all']})")
            say(f"{system}: {figures['windows_not_given']} windows not given before the run "
                f"ended{inexact}, top-10 recall at worst {figures['min_recall']}, "
                f"{figures['wan_bytes']:,} wide-area bytes")
        plots += ", latency.png"
    say(f"report: {work / 'bench.json'}, plots: {plots} in {work}")
    return 0


def _bench_load(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    from jetstream.lab.latency_bench import seconds_text
    from jetstream.lab.load_bench import run_load

    if args.emulate or args.only:
        msg = "bench: --load runs on this machine's own links; drop --emulate and --only"
        raise PlanError(msg)
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="jetstream-load-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = run_load(Path(args.topology), work, rates=args.rates, counts=args.queries,
                    duration_s=args.duration, seed=args.seed, keys=args.keys, say=say,
                    systems=args.systems)
    (work / "load.json").write_text(json.dumps(runs, indent=2))
    say("p95 after close of each query (seconds), CPU seconds per million records, peak "
        "memory (MB):")
    for run in runs:
        p95 = ", ".join(f"{name} {seconds_text(q['p95_s'])}"
                        for name, q in run["per_query"].items())
        say(f"  {run['system']:9} {run['rate']:>7,.0f}/s {run['queries']} quer"
            f"{'y' if run['queries'] == 1 else 'ies'}: {p95}; CPU "
            f"{run['cpu_s_per_million_records']}, memory {run['peak_rss_mb']:,}")
    say(f"report: {work / 'load.json'}")
    wrong = sum(q["unequal"] + q["changed"] for run in runs for q in run["per_query"].values())
    if wrong:
        say(f"load: FAILED: {wrong} windows were given final and then found unlike run_local or "
            f"changed; see unlike.jsonl in each run's folder under {work}")
        return 1
    return 0


def register(commands: Any) -> None:
    """Add this group's commands to ``commands`` (the parser's subparsers)."""
    gen_logs = commands.add_parser(
        "gen-logs", help="write synthetic CDN logs for every site, or live ones as they happen",
        description="Write OUT/<site>/part-NNN.csv for each site of the topology that holds a "
                    "cdn_logs source: Zipf-popular domains with regional differences, flash "
                    "crowds, heavy-tailed sizes and latencies, out-of-order and late records. "
                    "The same seed gives the same files. With --live, write a new file per "
                    "site every --chunk, stamped now, until --duration or Ctrl-C.")
    gen_logs.add_argument("--out", required=True, metavar="DIR", help="where to write")
    gen_logs.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                          help="which sites to write (default: the embedded local-3dc)")
    gen_logs.add_argument("--duration", metavar="D",
                          help="how much time the logs cover, e.g. 60s, 10m (default: 60s; "
                               "with --live: until Ctrl-C)")
    gen_logs.add_argument("--rate", type=float, default=1000.0, metavar="N",
                          help="records per second at each site (default: 1000)")
    gen_logs.add_argument("--domains", type=int, metavar="N",
                          help="how many domains the CDN serves (default: 2000)")
    gen_logs.add_argument("--zipf", type=float, metavar="S",
                          help="the Zipf exponent of domain popularity (default: 1.1)")
    gen_logs.add_argument("--regional", type=float, metavar="SHARE",
                          help="share of requests that follow a site's own popularity order "
                               "(default: 0.3)")
    gen_logs.add_argument("--seed", type=int, default=0, help="the random seed (default: 0)")
    gen_logs.add_argument("--files", type=int, default=1, metavar="N",
                          help="cut each site's period into N consecutive files (default: 1)")
    gen_logs.add_argument("--start", type=int, metavar="EPOCH_MS",
                          help="when the logs begin (default: now, to the second)")
    gen_logs.add_argument("--flash-crowd", action="append", default=[],
                          metavar="DOMAIN@SITE:START-END",
                          help="a surge of DOMAIN at SITE from START to END seconds into the "
                               "logs (30%% of the site's requests); repeatable")
    gen_logs.add_argument("--live", action="store_true",
                          help="write logs as they happen, a file per site and chunk")
    gen_logs.add_argument("--chunk", default="1s", metavar="D",
                          help="with --live, how often to write (default: 1s)")
    gen_logs.set_defaults(run=_gen_logs)

    demo = commands.add_parser(
        "demo", help="the CDN top-k query across three local sites, on live generated logs",
        description="Start a controller and every site of the topology as local processes, "
        "write live CDN logs at each site, run the query and show its newest windows, the "
        "wide-area bytes against the raw logs they replace, and each link's degradation "
        "level. Ctrl-C stops everything.")
    demo.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                      help="where the sites are (default: the embedded local-3dc)")
    live_options(demo, duration_s=60.0)
    demo.add_argument("--replay", action="store_true",
                      help="instead, replay the bundled sample logs to the end and exit")
    demo.add_argument("--edge", choices=["nginx"],
                      help="serve the traffic with a real nginx at each site (wrk makes the "
                           "requests, rsyslog sends the access log to the site over RELP) "
                           "instead of generating logs; needs Debian's nginx, rsyslog, "
                           "rsyslog-relp and wrk (default: generated logs)")
    demo.set_defaults(run=_demo)

    emulate = commands.add_parser(
        "emulate", help="run the demo over an emulated wide area (needs root and iproute2)",
        description="jetstream emulate TOPOLOGY: a network namespace per site, its link to "
        "its parent shaped with tc tbf at the topology's bandwidth, the controller and each "
        "site's process inside, live logs and the query's live view; Ctrl-C or --duration "
        "ends it and removes everything it made. From another terminal: jetstream emulate "
        "set-link SITE_A SITE_B 2mbit --topology TOPOLOGY changes a link while it runs; "
        "jetstream emulate down removes what a crashed run left.")
    emulate.add_argument("action", nargs="+",
                         metavar="TOPOLOGY | set-link A B BANDWIDTH | down")
    emulate.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                         help="for set-link and down: the running emulation's topology "
                              "(default: the embedded local-3dc)")
    live_options(emulate, duration_s=0.0)
    emulate.set_defaults(run=_emulate)

    bench = commands.add_parser(
        "bench", help="JetStream-py against shipping raw logs to one Spark job, same input",
        description="Generate CDN logs for every site, then in one run: the reference answer "
        "(run_local), JetStream-py replaying them through every site, and the backhaul "
        "baseline (each edge site's logs gzipped per window and shipped to the root, one "
        "plain Spark Structured Streaming job there). Reports wide-area bytes and top-10 "
        "accuracy per window for both, and records/s of the local stage against the plain "
        "job, as JSON and a PNG plot.")
    bench.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                       help="where the sites are (default: the embedded local-3dc)")
    bench.add_argument("--duration", type=float, default=120.0, metavar="S",
                       help="seconds of logs to generate (default: 120)")
    bench.add_argument("--rate", type=float, default=1000.0, metavar="N",
                       help="records per second at each site (default: 1000)")
    bench.add_argument("--seed", type=int, default=0, help="the log generator's seed")
    bench.add_argument("--out", metavar="DIR", help="where to write bench.json and the plot "
                       "(default: a new temporary folder)")
    bench.add_argument("--quick", action="store_true",
                       help="a small run (30 s at 100 records/s), for CI")
    bench.add_argument("--emulate", action="store_true",
                       help="also measure result latency with the sites in network namespaces "
                       "(needs root): live logs, each edge link shaped to --link for --phase, "
                       "then a tenth of it for --phase, JetStream-py then the backhaul")
    bench.add_argument("--link", default="200kbit", metavar="BANDWIDTH",
                       help="with --emulate: each edge link's bandwidth before the drop "
                       "(default: 200kbit)")
    bench.add_argument("--phase", type=positive_seconds, default=None, metavar="S",
                       help="with --emulate: seconds each system runs on --link, and again "
                       "after the drop; a window counts from 20 s in, so 640 gives at least "
                       "60 windows of 10 s on each side of the drop (default: half of "
                       "--duration)")
    bench.add_argument("--only", type=lambda t: t.split(","), default=None, metavar="S,S",
                       help="with --emulate: measure the latency of these systems, one after "
                       "the other: jetstream, fixed (JetStream-py with its sites' profiles "
                       "off: the policy plans with the levels' nominal sizes and errors), "
                       "backhaul (default: jetstream,backhaul)")
    bench.add_argument("--recover", action="store_true",
                       help="with --emulate: after the drop, the links come back to --link "
                       "for another --phase")
    bench.add_argument("--live-rate", type=float, default=300.0, metavar="N",
                       help="with --emulate: live records per second at each site "
                       "(default: 300)")
    bench.add_argument("--load", action="store_true",
                       help="instead, latency after close under load on this machine: "
                       "JetStream-py, then one plain Spark job reading every site's folder, "
                       "a streaming query per standing query (the ceiling of shipping raw "
                       "logs), each alone, at every --rates and "
                       "--queries; --duration seconds of live logs each (use 120 or more)")
    bench.add_argument("--rates", type=numbers(float), default=[300.0, 3000.0],
                       metavar="N,N,...", help="with --load: records/s at each site "
                       "(default: 300,3000)")
    bench.add_argument("--queries", type=numbers(int), default=[1], metavar="N,N,...",
                       help="with --load: how many of the six standing queries run at once "
                       "(default: 1, the CDN top-k)")
    bench.add_argument("--keys", type=int, default=20_000, metavar="N",
                       help="with --load: distinct domains in the logs (default: 20000)")
    bench.add_argument("--systems", type=lambda t: t.split(","),
                       default=["jetstream", "baseline"], metavar="S,S",
                       help="with --load: jetstream, baseline, push (ours with the logs "
                       "POSTed to each site over HTTP) (default: jetstream,baseline)")
    bench.set_defaults(run=_bench)
