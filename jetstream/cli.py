"""The ``jetstream`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

from jetstream import __version__, trace
from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.planner import plan_query
from jetstream.aggtree.topology import spark_key_problem
from jetstream.control.client import DEFAULT_CONTROLLER, ControllerClient
from jetstream.control.daemons import run_controller, run_site, run_worker
from jetstream.control.launch import LocalCluster, free_port, replay
from jetstream.control.results_view import follow_table, render_window
from jetstream.control.security import Security, make_dev_certs
from jetstream.control.status_view import print_status, status_dict, watch_status
from jetstream.cubes import parse_retention
from jetstream.dsl import Query
from jetstream.errors import ControlPlaneError, JetstreamError, PlanError
from jetstream.local import LocalRun, run_local
from jetstream.planwire import query_to_proto
from jetstream.queryfile import load_query
from jetstream.results import WindowResult, write_json_lines
from jetstream.rewrite import explain
from jetstream.runtime import SiteOptions
from jetstream.stage.archive import READ_FILES, ReadFiles
from jetstream.units import parse_bandwidth
from jetstream.windows import format_duration, parse_duration
from jetstream.wire import result_from_proto

__all__ = ["main"]

#: The topology ``jetstream controller`` runs when given none: everything on this machine.
#: (``topologies/local-3dc.yaml`` links to it.)
DEFAULT_TOPOLOGY = Path(__file__).resolve().parent / "aggtree" / "local-3dc.yaml"
#: The example queries and sample logs of a source checkout (the demo and bench use them).
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _security(args: argparse.Namespace) -> Security:
    """The process's transport security from ``--tls-dir``/``--token``/``--insecure`` and
    the environment (see :meth:`Security.resolve`)."""
    return Security.resolve(args.tls_dir, args.token, args.insecure)


def _client(args: argparse.Namespace) -> ControllerClient:
    return ControllerClient(args.controller, security=_security(args))


def _certs(args: argparse.Namespace) -> int:
    hosts = [h for h in (args.hosts or "").split(",") if h.strip()]
    sites = [s.strip() for s in (args.sites or "").split(",") if s.strip()]
    if args.keep and (Path(args.out_dir) / "ca.pem").exists():
        lacking = [who for who in (*sites, "controller", "cli") if sites
                   and not (Path(args.out_dir) / who / "node.pem").exists()]
        if lacking:
            msg = (f"{args.out_dir} holds a CA already, but no certificate for "
                   f"{', '.join(lacking)} (made before --sites?): remove the folder, or give "
                   "--force instead of --keep (what the CA signed stops working)")
            raise ControlPlaneError(msg)
        print(f"{args.out_dir} holds a CA already; keeping it (--keep)")
        return 0
    made = make_dev_certs(Path(args.out_dir), hosts, days=args.days, force=args.force,
                          sites=sites)
    if not sites:
        print(f"a development CA, a node certificate for {', '.join(made.hosts)} and a token "
              f"in {made.folder}, valid until {made.not_after:%Y-%m-%d}. For development "
              "only: anyone with the folder is in the cluster, as any site.")
        print(f"use it: jetstream controller --tls-dir {made.folder}, jetstream site --tls-dir "
              f"{made.folder} ..., or export JETSTREAM_TLS_DIR={made.folder}")
        return 0
    print(f"a development CA and a token in {made.folder}, and a certificate for "
          f"{', '.join(made.hosts)} in a TLS folder each, valid until "
          f"{made.not_after:%Y-%m-%d}: a site registers and sends partials only under the "
          "name in its certificate.")
    for holder, where in made.folders.items():
        use = (f"jetstream site --name {holder} --tls-dir {where} ..." if holder in sites
               else f"jetstream {'controller' if holder == 'controller' else 'CMD'} "
               f"--tls-dir {where} ...")
        print(f"  {where}: {use}")
    print(f"keep {made.folder / 'ca-key.pem'} away from the sites: it signs certificates")
    return 0


def _explain(args: argparse.Namespace) -> int:
    if args.controller:
        print(_client(args).explain(args.query))
        return 0
    query = load_query(args.query)
    print(explain(query, partitions=args.partitions))
    if args.topology:
        print()
        print(plan_query(query, load_topology(args.topology)).render())
    return 0


def _controller(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    print(f"jetstream controller: {topology.name} ({len(topology.sites)} sites, root "
          f"{topology.root}) on {args.host}:{args.port}; Ctrl-C stops", file=sys.stderr)
    cubes = [query_to_proto(load_query(path)) for path in args.cube or ()]
    run_controller(topology, args.port, security=_security(args), host=args.host,
                   heartbeat_interval_s=args.heartbeat_interval,
                   heartbeat_timeout_s=args.heartbeat_timeout,
                   state_dir=Path(args.state_dir) if args.state_dir else None,
                   metrics_port=args.metrics_port, dashboard_port=args.dashboard_port,
                   dashboard_host=args.dashboard_host, allow_code=args.allow_code,
                   cubes=cubes, http_token=args.http_token)
    return 0


def _site(args: argparse.Namespace) -> int:
    print(f"jetstream site {args.name}: registering with {args.controller}; Ctrl-C stops",
          file=sys.stderr)
    options = SiteOptions(input_dir=Path(args.input) if args.input else None,
                          replay=args.replay, deadline_s=args.window_deadline,
                          idle_s=args.idle_timeout, spark_master=args.spark_master,
                          trigger_s=args.trigger, batch_hold_s=args.batch_hold,
                          read_files=ReadFiles(args.read_files, args.archive_retention,
                                               args.archive_max_bytes),
                          warm_up_s=args.warm_up, spark_conf=dict(args.spark_conf or ()),
                          cubes=args.cubes, retention=parse_retention(args.retention))
    if args.state_dir:
        options.state_dir = Path(args.state_dir)
    run_site(args.name, args.controller, security=_security(args), port=args.port,
             host=args.host, advertise=args.advertise, options=options,
             metrics_port=args.metrics_port, http_token=args.http_token)
    return 0


def _worker(args: argparse.Namespace) -> int:
    print(f"jetstream worker {args.site}/{args.server}: registering with {args.register}; "
          "Ctrl-C stops", file=sys.stderr)
    run_worker(args.site, args.server, args.register, security=_security(args),
               host=args.host, port=args.port, parent_pid=args.parent_pid, epoch=args.epoch,
               deadline_s=args.window_deadline)
    return 0


def _spark_setting(text: str) -> tuple[str, str]:
    """``--spark-conf KEY=VALUE``, checked as the topology's ``spark_conf`` is."""
    key, equals, value = text.partition("=")
    if not equals:
        msg = f"expected KEY=VALUE, e.g. spark.driver.memory=2g, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    problem = spark_key_problem(key)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return key, value


def _submit(args: argparse.Namespace) -> int:
    since = None if args.since is None else parse_time(
        args.since, time.time_ns() // 1_000_000, "--since")
    response = _client(args).submit(args.query, since)
    print(f"submitted {response.query}\n{response.plan}")
    if response.backfill:
        print(response.backfill)
    return 0


def _history(args: argparse.Namespace) -> int:
    now_ms = time.time_ns() // 1_000_000
    since = parse_time(args.since, now_ms, "--since")
    until = parse_time(args.until, now_ms, "--until") if args.until else now_ms
    response = _client(args).history(args.query, since, until)
    results = [result_from_proto(r) for r in response.results]
    if args.json or not sys.stdout.isatty():
        write_json_lines(results, sys.stdout)
    else:
        console = Console()
        for result in results:
            console.print(render_window(result))
    print(f"jetstream history: {len(results)} window(s) from the "
          f"{response.resolution_ms // 1000} s cubes of {response.stored}; the sites sent "
          f"{response.bytes:,} bytes", file=sys.stderr)
    return 0


def parse_time(text: str, now_ms: int, what: str) -> int:
    """Epoch ms from ``text``: a duration ago (``1h``), an ISO 8601 time (UTC unless it
    says otherwise), or epoch milliseconds."""
    if text.isdigit():
        return int(text)
    try:
        return now_ms - parse_duration(text, what)
    except PlanError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        msg = (f"{what} {text!r}: give a duration ago (30m, 1h, 2d), an ISO 8601 time "
               "(2026-11-24T10:00:00Z) or epoch milliseconds")
        raise PlanError(msg) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _status(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.watch:
        watch_status(client.status, interval_s=args.interval)
        return 0
    status = client.status()
    if args.json:
        print(json.dumps(status_dict(status), indent=2))
    else:
        print_status(status)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    _client(args).cancel(args.name)
    print(f"cancelled {args.name}")
    return 0


def _level(args: argparse.Namespace) -> int:
    now = _client(args).set_level(args.name, args.site, args.level or "")
    how = "pinned by an operator" if now.pinned else "chosen by the link's policy"
    print(f"{args.name}: link {now.link} at {now.level!r} ({how})")
    print("levels: " + ", ".join(f"{i} {name!r}" for i, name in enumerate(now.levels)))
    return 0


def _results(args: argparse.Namespace) -> int:
    results = _client(args).results(args.name, args.timeout)
    if args.output:
        results = _also_to(results, args.output)
    if args.json or not sys.stdout.isatty():
        for result in results:
            print(json.dumps(result.to_dict()), flush=True)
    else:
        follow_table(results)
    return 0


def _also_to(results: Iterator[WindowResult], path: str) -> Iterator[WindowResult]:
    """``results``, each also appended to the JSON lines file at ``path`` as it passes."""
    with open(path, "a", encoding="utf-8") as sink:
        for result in results:
            write_json_lines([result], sink)
            sink.flush()
            yield result


def _local(args: argparse.Namespace) -> int:
    query = load_query(args.query)
    if not Path(args.input).exists():
        msg = f"--input {args.input}: no such file or directory"
        raise PlanError(msg)
    results = run_local(query, args.input)
    _output(results, args.output)
    _report(results, sys.stderr)
    return 0


def _output(results: list[WindowResult], path: str | None) -> None:
    if path in (None, "-"):
        write_json_lines(results, sys.stdout)
    else:
        with open(path, "w", encoding="utf-8") as out:
            write_json_lines(results, out)


def _progress(command: str) -> Callable[[str], None]:
    """Prints a long command's progress on stderr, each line naming the command."""
    def say(line: str) -> None:
        print(f"jetstream {command}: {line}", file=sys.stderr, flush=True)
    return say


def _run(args: argparse.Namespace) -> int:
    say = _progress("run")
    input_dir = Path(args.input)
    query = load_query(args.query)  # run once, here: the sites get its plan
    if not input_dir.is_dir():
        msg = f"--input {input_dir}: not a directory (it should hold one folder per site)"
        raise PlanError(msg)
    topology = load_topology(args.topology)
    missing = [s.name for s in topology.sites if s.sources and not (input_dir / s.name).is_dir()]
    if missing:
        say(f"note: no input folder for {', '.join(missing)} in {input_dir}; "
            "those sites read nothing")

    with LocalCluster(Path(args.topology), input_dir, replay=True,
                      window_deadline_s=args.window_deadline, say=say) as cluster:
        results = replay(cluster, query, timeout_s=args.timeout, say=say)
    _output(results, args.output)
    incomplete = sum(r.sites_reporting != r.sites_expected for r in results)
    say(f"{len(results)} windows, every one final"
        + (f"; {incomplete} without every site" if incomplete else "")
        + (f"; written to {args.output}" if args.output not in (None, "-") else ""))
    return 0


def _report(results: LocalRun, out: TextIO) -> None:
    stats = results.stats
    print(f"{len(results)} windows from {stats.records_in} records; "
          f"{stats.late_records} late, {stats.rejects.total} rejected", file=out)
    for reason, n in stats.rejects.counts.most_common():
        print(f"  rejected {n}: {reason}", file=out)
    for rejected in stats.rejects.kept[:5]:
        print(f"    e.g. {rejected.where}: {rejected.reason}", file=out)


def _gen_logs(args: argparse.Namespace) -> int:
    # Imported here so that only this command pays for loading numpy.
    import contextlib
    import re
    import threading
    import time

    from jetstream.lab.loggen import FlashCrowd, LogSpec, write_live, write_logs
    from jetstream.windows import parse_duration

    say = _progress("gen-logs")
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


def _live_query(args: argparse.Namespace) -> Query:
    """The query of a live run (``--query``, or the CDN top-k example), run once, here,
    and refused before anything starts if it does not load."""
    return load_query(Path(args.query) if args.query else EXAMPLES / "cdn_topk.py")


def _demo(args: argparse.Namespace) -> int:
    began = time.monotonic()
    say = _progress("demo")
    query = _live_query(args)
    if args.replay:
        return _replay_demo(query, EXAMPLES / "logs", say)
    from jetstream.lab.demo import live_demo
    from jetstream.lab.loggen import LogSpec

    work = Path(tempfile.mkdtemp(prefix="jetstream-demo-"))
    say(f"the {query.name} query across the sites of {Path(args.topology).stem}, on live "
        f"generated CDN logs; it shows complete windows (every site reporting, wholly after "
        f"the logs began) " + (f"for {args.duration:g}s from the first one" if args.duration
                               else "until Ctrl-C"))
    dashboard = _dashboard_port(args, "127.0.0.1", say)
    summary = live_demo(Path(args.topology), query, work, rate=args.rate,
                        duration_s=args.duration or None, spec=LogSpec(), seed=args.seed,
                        say=say, console=Console(),
                        cluster_options={"dashboard_port": dashboard})
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


def _dashboard_port(args: argparse.Namespace, host: str, say: Callable[[str], None]) -> int:
    """The port a live run's controller serves its dashboard on (0: none), said to the user."""
    port = 0 if args.no_dashboard else args.dashboard_port or free_port()
    if port:
        say(f"dashboard: http://{host}:{port}/ (once the controller is up)")
    return port


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
    say = _progress("emulate")
    topology_file = Path(action)
    area = WideArea(load_topology(topology_file))
    query = _live_query(args)
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
        dashboard = _dashboard_port(args, HOST_ADDRESS, say)
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

    say = _progress("bench")
    if args.load:
        return _bench_load(args, say)
    if args.only and not args.emulate:
        msg = (f"bench: --only {args.only} picks a system for the latency part, which runs "
               "only with --emulate; add --emulate, or drop --only")
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
        from jetstream.lab.latency_bench import SYSTEMS, run_latency, seconds_text

        report["latency"] = run_latency(
            Path(args.topology), query, work,
            phase_s=args.phase if args.phase is not None else duration / 2,
            rate=args.live_rate, link=args.link, seed=args.seed, say=say,
            systems=[args.only] if args.only else list(SYSTEMS))
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
        say(f"latency over {latency['link']} for {latency['phase_s']:g}s, then "
            f"{latency['dropped_to']} for {latency['phase_s']:g}s (p50 / p95 / p99, windows "
            "counted; a window closes when the last site receives the record that moves its "
            "watermark past the window's end)")
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
                    for part in ("before_drop", "after_drop"))
                say(f"{system} {what}: {parts}")
            inexact = ("" if figures["windows_inexact"] is None
                       else f", {figures['windows_inexact']} marked inexact")
            say(f"{system}: {figures['windows_not_given']} windows not given before the run "
                f"ended{inexact}, top-10 recall at worst {figures['min_recall']}")
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
    return 0


def _numbers(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            msg = f"expected a comma-separated list of numbers, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
    return parse


def _positive_seconds(text: str) -> float:
    """A command-line duration in seconds: a finite number above zero."""
    return _duration(text, zero=False)


def _seconds_or_zero(text: str) -> float:
    """A command-line duration in seconds: a finite number, zero or above."""
    return _duration(text, zero=True)


def _duration(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf or (zero and value == 0)):
        msg = f"expected a number of seconds, {'0 or more' if zero else 'above 0'}, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _archive_retention(text: str) -> float:
    """``--archive-retention``: a duration above 0 such as ``12h`` or ``7d``, in seconds."""
    try:
        seconds = parse_duration(text, "archive retention") / 1000
    except PlanError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        msg = (f"expected a duration above 0, such as 12h or 7d, not {text!r} "
               "(to keep no read file, use --read-files delete)")
        raise argparse.ArgumentTypeError(msg)
    return seconds


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def _size(text: str) -> int:
    """A number of bytes, with K, M, G or T for powers of 1024: ``500M``, ``20G``."""
    m = _SIZE.match(text)
    value = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")) if m else 0
    if value <= 0:
        msg = f"expected a size in bytes above 0, such as 500M or 20G, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _security_options(parser: argparse.ArgumentParser) -> None:
    """How a process that serves or dials gRPC secures it (see docs/security.md)."""
    group = parser.add_argument_group(
        "security", "mutual TLS and a token on every call; one of --tls-dir (or "
        "JETSTREAM_TLS_DIR) and --insecure is needed")
    group.add_argument("--tls-dir", metavar="DIR",
                       help="ca.pem, node.pem, node-key.pem and optionally token (`jetstream "
                            "certs DIR` makes a development set; default: $JETSTREAM_TLS_DIR)")
    group.add_argument("--token", metavar="TOKEN",
                       help="the token every call carries and every server requires "
                            "(default: $JETSTREAM_TOKEN, else DIR/token if there is one)")
    group.add_argument("--insecure", action="store_true",
                       help="no TLS and no authentication: anyone who can reach a port can "
                            "use it; for a trusted test network only")


def _metrics_option(parser: argparse.ArgumentParser) -> None:
    """Where a long-running process serves its Prometheus metrics."""
    parser.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics, on the "
                             "--host address (default: 0, off; plain HTTP)")
    parser.add_argument("--http-token", action="store_true",
                        help="require the process's token (--token, JETSTREAM_TOKEN or the "
                             "TLS folder's) on /metrics and the dashboard: Authorization: "
                             "Bearer TOKEN, or Basic with the token as password")


def _live_options(parser: argparse.ArgumentParser, *, duration_s: float) -> None:
    """The options of a live run on generated logs (demo, emulate)."""
    parser.add_argument("--query", metavar="QUERY.py",
                        help="the query (default: examples/cdn_topk.py)")
    parser.add_argument("--duration", type=float, default=duration_s, metavar="S",
                        help=f"stop S seconds after the first complete window (default: "
                        f"{duration_s:g}; 0: run until Ctrl-C)")
    parser.add_argument("--rate", type=float, default=200.0, metavar="N",
                        help="log records per second at each site (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="the log generator's seed")
    parser.add_argument("--dashboard-port", type=int, metavar="PORT",
                        help="serve the live dashboard on PORT of the controller's address "
                        "(default: a free port)")
    parser.add_argument("--no-dashboard", action="store_true", help="serve no dashboard")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jetstream",
        description="JetStream-py: one streaming query over many sites and thin links.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain_cmd = commands.add_parser(
        "explain", help="show a query's plan, how the rewriter changes it, and why",
        description="Print the logical plan, each rewrite rule that fired (or why it "
                    "declined), and the rewritten plan; with --topology, also where each part "
                    "would run.")
    explain_cmd.add_argument("query", metavar="QUERY.py",
                             help="a Python file that defines `query`")
    explain_cmd.add_argument("--partitions", type=int, default=1, metavar="N",
                             help="spread merges over N key partitions (default: 1)")
    explain_cmd.add_argument("--topology", metavar="T.yaml",
                             help="also show the physical plan on this topology")
    explain_cmd.add_argument("--controller", metavar="HOST:PORT",
                             help="ask a running controller instead (its live topology)")
    _security_options(explain_cmd)
    explain_cmd.set_defaults(run=_explain)

    certs = commands.add_parser(
        "certs", help="make a development CA, node certificate and token for --tls-dir",
        description="Write OUT_DIR/ca.pem and ca-key.pem (a development CA), node.pem and "
        "node-key.pem (one certificate for every process, valid as server and client, for "
        "localhost, 127.0.0.1 and --hosts) and token; with --sites, a TLS folder per site, "
        "for the controller and for the CLI instead of the shared certificate, each naming "
        "its holder. Key and token files are readable by their owner only. For development: "
        "in production bring your own CA (docs/security.md).")
    certs.add_argument("out_dir", metavar="OUT_DIR", help="where to write the files")
    certs.add_argument("--hosts", metavar="H1,H2",
                       help="more names or IP addresses processes are dialled at")
    certs.add_argument("--sites", metavar="S1,S2",
                       help="a certificate per site instead of one for all (OUT_DIR/S1, ...), "
                            "naming the site, and one for the controller (OUT_DIR/controller) "
                            "and the CLI (OUT_DIR/cli)")
    certs.add_argument("--days", type=int, default=30,
                       help="how long the certificates are valid (default: 30)")
    existing = certs.add_mutually_exclusive_group()
    existing.add_argument("--force", action="store_true",
                          help="replace a CA already in OUT_DIR (what it signed stops working)")
    existing.add_argument("--keep", action="store_true",
                          help="if OUT_DIR holds a CA already, leave it and succeed (for "
                               "start-up scripts)")
    certs.set_defaults(run=_certs)

    controller = commands.add_parser("controller", help="run the global controller")
    controller.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                            help="sites, servers and links (default: the embedded local-3dc)")
    controller.add_argument("--port", type=int, default=7070)
    controller.add_argument("--host", default="127.0.0.1")
    controller.add_argument("--heartbeat-interval", type=float, default=2.0, metavar="S",
                            help="how often sites report (default: 2s)")
    controller.add_argument("--heartbeat-timeout", type=float, default=6.0, metavar="S",
                            help="a site silent this long is dead (default: 6s)")
    controller.add_argument("--state-dir", metavar="DIR",
                            help="keep the queries and their results here, so that a "
                                 "restarted controller takes them up again (default: "
                                 "in memory only)")
    _metrics_option(controller)
    controller.add_argument("--dashboard-port", type=int, default=0, metavar="PORT",
                            help="serve the live dashboard at http://DASHBOARD_HOST:PORT/ "
                                 "(default: 0, off; read-only, plain HTTP; --http-token "
                                 "guards it)")
    controller.add_argument("--dashboard-host", default="127.0.0.1", metavar="HOST",
                            help="the address the dashboard listens on (default: 127.0.0.1)")
    controller.add_argument("--cube", action="append", metavar="QUERY.py",
                            help="keep cubes of this query at the sites for questions asked "
                                 "later (jetstream history): it runs from start, as soon as "
                                 "it can be placed, like a submitted query (repeatable)")
    controller.add_argument("--allow-code", action="store_true",
                            help="accept queries with map steps: their Python functions "
                                 "travel pickled and run on the sites, so whoever can submit "
                                 "runs code there (default: off, such queries are refused; "
                                 "jetstream run and demo turn it on)")
    _security_options(controller)
    controller.set_defaults(run=_controller)

    site = commands.add_parser("site", help="run a site controller")
    site.add_argument("--name", required=True, help="the site's name in the topology")
    site.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    site.add_argument("--port", type=int, default=0, help="listen port (default: any free)")
    site.add_argument("--host", default="127.0.0.1")
    site.add_argument("--advertise", metavar="HOST:PORT",
                      help="the address the controller and other sites reach this site at, "
                           "when not --host:--port (behind NAT, a proxy or a tunnel)")
    site.add_argument("--input", metavar="DIR",
                      help="the folder this site's log shippers drop CSV files into")
    site.add_argument("--replay", action="store_true",
                      help="process what --input holds, then end (finite input)")
    site.add_argument("--spark-master", metavar="URL",
                      help="Spark master of the local stage, e.g. local[2] or spark://host:7077 "
                           "(default: the topology's, from the controller)")
    site.add_argument("--spark-conf", action="append", type=_spark_setting,
                      metavar="KEY=VALUE",
                      help="a Spark setting of the local stage, e.g. spark.driver.memory=2g; "
                           "repeat for more (over the topology's spark_conf and the defaults)")
    site.add_argument("--state-dir", metavar="DIR",
                      help="checkpoints and quarantined records (default: a temp folder)")
    site.add_argument("--window-deadline", type=float, metavar="S",
                      help="wait this long for a silent child before a window goes out "
                           "incomplete (default: the query's max_latency, else 10s)")
    site.add_argument("--trigger", type=_positive_seconds, default=SiteOptions.trigger_s,
                      metavar="S", help="the live local stage reads new files this often "
                                        f"(default: {SiteOptions.trigger_s:g}s)")
    site.add_argument("--batch-hold", type=_seconds_or_zero, default=SiteOptions.batch_hold_s,
                      metavar="S", help="a new file waits up to this long for the next to "
                                        "share a micro-batch, unless its records may close "
                                        "a window; 0: each trigger reads what landed "
                                        f"(default: {SiteOptions.batch_hold_s:g}s)")
    site.add_argument("--warm-up", type=_seconds_or_zero, default=SiteOptions.warm_up_s,
                      metavar="S", help="before a live local stage starts, stream made-up "
                                        "records through a copy of it for this long, so "
                                        "that its first windows do not wait for the JVM "
                                        "to compile; 0: off "
                                        f"(default: {SiteOptions.warm_up_s:g}s)")
    site.add_argument("--read-files", choices=READ_FILES, default=ReadFiles.mode,
                      help="what becomes of an --input file once every live query here has "
                           "read it: moved to STATE_DIR/<site>/archive/, deleted, or kept in "
                           "--input (a replayed input is always kept; default: "
                           f"{ReadFiles.mode})")
    site.add_argument("--archive-retention", type=_archive_retention, metavar="DURATION",
                      default=ReadFiles.retention_s,
                      help="archived files older than this are deleted, e.g. 12h, 7d "
                           f"(default: {format_duration(int(ReadFiles.retention_s * 1000))})")
    site.add_argument("--archive-max-bytes", type=_size, metavar="SIZE",
                      default=ReadFiles.max_bytes,
                      help="the archive's bound: past it the oldest files are deleted, e.g. "
                           f"500M, 20G (default: {ReadFiles.max_bytes // 2**30}G)")
    site.add_argument("--idle-timeout", type=float, default=5.0, metavar="S",
                      help="input without records this long is idle and holds no window "
                           "back (default: 5s)")
    site.add_argument("--cubes", action=argparse.BooleanOptionalAction, default=True,
                      help="keep every partial sent in STATE_DIR/<site>/cubes.sqlite until "
                           "the parent acks it, across restarts, with time rollups "
                           "(default: on; see docs/cubes.md)")
    site.add_argument("--retention", default="10s=1h,1m=1d,1h=30d", metavar="RES=KEEP,...",
                      help="how long the cube store keeps each resolution "
                           "(default: 10s=1h,1m=1d,1h=30d)")
    _metrics_option(site)
    _security_options(site)
    site.set_defaults(run=_site)

    worker = commands.add_parser(
        "worker", help="run a worker of a site: key partitions of its merges",
        description="Serve the key partitions of merges that a site's controller places on "
                    "this server. `jetstream site` starts one per server of its site itself, "
                    "as child processes; started by hand on another machine, a worker is "
                    "not supported yet.")
    worker.add_argument("--site", required=True, help="the site this worker belongs to")
    worker.add_argument("--server", required=True,
                        help="the server it runs on: one of the site's in the topology")
    worker.add_argument("--register", required=True, metavar="HOST:PORT",
                        help="the site's gRPC address, where the worker registers")
    worker.add_argument("--port", type=int, default=0, help="listen port (default: any free)")
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument("--parent-pid", type=int, default=0, metavar="PID",
                        help="end when this process ends (the site that started it)")
    worker.add_argument("--epoch", type=int, default=0, metavar="N",
                        help="how many times this server's worker started before: its "
                             "results replace theirs (default: 0)")
    worker.add_argument("--window-deadline", type=float, metavar="S",
                        help="its site's --window-deadline (default: the query's "
                             "max_latency, else 10s)")
    _security_options(worker)
    worker.set_defaults(run=_worker)

    run = commands.add_parser(
        "run", help="replay finite input through the full distributed path, then exit",
        description="Start the controller and every site of the topology as local processes "
                    "(each site's local stage in its own Spark JVM), replay DIR/<site>/*.csv "
                    "through them over gRPC, write one JSON object per window, and exit when "
                    "every window is final.")
    run.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), metavar="T.yaml",
                     help="sites, servers and links (default: the embedded local-3dc)")
    run.add_argument("--query", required=True, metavar="QUERY.py",
                     help="a Python file that defines `query`")
    run.add_argument("--input", required=True, metavar="DIR",
                     help="one folder of CSV files per site: DIR/<site>/*.csv")
    run.add_argument("--output", metavar="OUT.jsonl", help="where to write (default: stdout)")
    run.add_argument("--timeout", type=float, default=600.0, metavar="S",
                     help="give up if the run takes longer (default: 600s)")
    run.add_argument("--window-deadline", type=float, default=120.0, metavar="S",
                     help="how long a window waits for a silent site (default: 120s; replay "
                          "compresses time, so sites finish far apart)")
    run.set_defaults(run=_run)

    submit = commands.add_parser(
        "submit", help="submit a query to the controller",
        description="Submit QUERY.py to the controller, which places it on the sites. With "
                    "--since, its results start with the windows since then, answered from "
                    "the sites' cubes of a query that ran (as `jetstream history` answers), "
                    "and it runs live from the end of that query's newest complete window: "
                    "no gap, nothing counted twice.")
    submit.add_argument("query", metavar="QUERY.py")
    submit.add_argument("--since", metavar="TIME",
                        help="backfill from then: a duration ago (30m), an ISO 8601 time, or "
                             "epoch ms")
    submit.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    _security_options(submit)
    submit.set_defaults(run=_submit)

    history = commands.add_parser(
        "history", help="a windowed aggregate over the past, from the sites' cubes",
        description="Answer QUERY.py over the windows inside [--since, --until) from the "
                    "cubes the sites keep of a query that ran: its group keys among the "
                    "stored query's, its aggregates among its, the same steps before the "
                    "window (filters on the stored keys aside), a window made of a kept "
                    "resolution (10 s windows for an hour, 1 min rollups for a day, 1 h for "
                    "30 days by default). Refused, naming what is missing, otherwise. A table "
                    "in a terminal, JSON lines (each with \"history\": true) when piped or "
                    "with --json.")
    history.add_argument("query", metavar="QUERY.py")
    history.add_argument("--since", required=True, metavar="TIME",
                         help="the start: a duration ago (30m, 1h), an ISO 8601 time, or "
                              "epoch ms")
    history.add_argument("--until", metavar="TIME", help="the end (default: now)")
    history.add_argument("--json", action="store_true", help="JSON lines even in a terminal")
    history.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    _security_options(history)
    history.set_defaults(run=_history)

    status = commands.add_parser("status", help="sites, queries, trees and link utilisation")
    status.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    shown = status.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="machine-readable output")
    shown.add_argument("--watch", action="store_true",
                       help="a live view, redrawn every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=float, default=1.0, metavar="S",
                        help="with --watch, how often to redraw (default: 1s)")
    _security_options(status)
    status.set_defaults(run=_status)

    cancel = commands.add_parser("cancel", help="stop a running query everywhere")
    cancel.add_argument("name", help="the query's name")
    cancel.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    _security_options(cancel)
    cancel.set_defaults(run=_cancel)

    level = commands.add_parser(
        "level", help="show or pin the degradation level of a site's link to its parent",
        description="Without LEVEL, show where the link of SITE to its parent is for query "
        "NAME. With LEVEL (a level's name or index), hold it there; 'auto' hands the choice "
        "back to the link's policy. The running query is not restarted; levels past the "
        "query's SLO max_error are refused.")
    level.add_argument("name", help="the query's name")
    level.add_argument("site", help="the site whose link to its parent to show or pin")
    level.add_argument("level", nargs="?", help="a level's name or index, or 'auto'")
    level.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    _security_options(level)
    level.set_defaults(run=_level)

    results = commands.add_parser(
        "results", help="follow a query's results: a live table, or JSON lines",
        description="Follow a query's results as they arrive: a live table of the newest "
                    "windows in a terminal, JSON lines (one per window, corrections "
                    "included) when piped or with --json. Ends when the query does.")
    results.add_argument("name", help="the query's name")
    results.add_argument("--controller", default=DEFAULT_CONTROLLER, metavar="HOST:PORT")
    results.add_argument("--timeout", type=float, metavar="S", help="stop after S seconds")
    results.add_argument("--json", action="store_true", help="JSON lines even in a terminal")
    results.add_argument("--output", metavar="OUT.jsonl",
                         help="also append every result to this JSON lines file")
    _security_options(results)
    results.set_defaults(run=_results)

    local = commands.add_parser(
        "local", help="run a query with the reference executor (one process, exact)",
        description="Run a query over finite input with the reference executor and write one "
                    "JSON object per window.")
    local.add_argument("--query", required=True, metavar="QUERY.py",
                       help="a Python file that defines `query`")
    local.add_argument("--input", required=True, metavar="PATH",
                       help="a CSV file, or a directory searched for *.csv")
    local.add_argument("--output", metavar="OUT.jsonl", help="where to write (default: stdout)")
    local.set_defaults(run=_local)

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
    _live_options(demo, duration_s=60.0)
    demo.add_argument("--replay", action="store_true",
                      help="instead, replay the bundled sample logs to the end and exit")
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
                         help="for set-link and down: the running emulation's topology")
    _live_options(emulate, duration_s=0.0)
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
    bench.add_argument("--phase", type=_positive_seconds, default=None, metavar="S",
                       help="with --emulate: seconds each system runs on --link, and again "
                       "after the drop; a window counts from 20 s in, so 640 gives at least "
                       "60 windows of 10 s on each side of the drop (default: half of "
                       "--duration)")
    bench.add_argument("--only", choices=("jetstream", "backhaul"), default=None,
                       help="with --emulate: measure the latency of this system alone (half "
                       "the time; for traces), not both side by side")
    bench.add_argument("--live-rate", type=float, default=300.0, metavar="N",
                       help="with --emulate: live records per second at each site "
                       "(default: 300)")
    bench.add_argument("--load", action="store_true",
                       help="instead, latency after close under load on this machine: "
                       "JetStream-py, then one plain Spark job reading every site's folder "
                       "(the ceiling of shipping raw logs), each alone, at every --rates and "
                       "--queries; --duration seconds of live logs each (use 120 or more)")
    bench.add_argument("--rates", type=_numbers(float), default=[300.0, 3000.0],
                       metavar="N,N,...", help="with --load: records/s at each site "
                       "(default: 300,3000)")
    bench.add_argument("--queries", type=_numbers(int), default=[1], metavar="N,N,...",
                       help="with --load: how many of the six standing queries run at once "
                       "(default: 1, the CDN top-k; the baseline runs with 1 only)")
    bench.add_argument("--keys", type=int, default=20_000, metavar="N",
                       help="with --load: distinct domains in the logs (default: 20000)")
    bench.add_argument("--systems", type=lambda t: t.split(","),
                       default=["jetstream", "baseline"], metavar="S,S",
                       help="with --load: jetstream, baseline or both (default: both)")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("controller", "site", "worker"):
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)  # else a line per micro-batch
        trace.enable_from_env()  # JETSTREAM_TRACE=1: a window's steps, see jetstream.trace
    try:
        code: int = args.run(args)
    except (JetstreamError, OSError) as e:
        print(f"jetstream {args.command}: error: {e}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
