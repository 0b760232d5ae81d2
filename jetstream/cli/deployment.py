"""Running a deployment's processes: the controller, a site, a site's worker, and the
certificates they use (``certs``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jetstream.aggtree.loader import load_topology
from jetstream.aggtree.topology import spark_key_problem
from jetstream.approx.profile import PROFILE_EVERY
from jetstream.cli.common import (
    DEFAULT_TOPOLOGY,
    archive_retention,
    controller_option,
    metrics_option,
    positive_seconds,
    seconds_or_zero,
    security,
    security_options,
    size,
)
from jetstream.control.daemons import required_token, run_controller, run_site, run_worker
from jetstream.dataplane.cubes import parse_retention
from jetstream.dataplane.options import SiteOptions
from jetstream.errors import ControlPlaneError
from jetstream.planwire import query_to_proto
from jetstream.queryfile import load_query
from jetstream.security import CERT_FILE, KEY_FILE, Security, make_dev_certs
from jetstream.stage.archive import READ_FILES, ReadFiles
from jetstream.stage.push import Spool, serve_push
from jetstream.stage.syslog import Intake, serve_syslog
from jetstream.windows import format_duration

__all__ = ["register"]


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


def _controller(args: argparse.Namespace) -> int:
    topology = load_topology(args.topology)
    print(f"jetstream controller: {topology.name} ({len(topology.sites)} sites, root "
          f"{topology.root}) on {args.host}:{args.port}; Ctrl-C stops", file=sys.stderr)
    cubes = [query_to_proto(load_query(path)) for path in args.cube or ()]
    run_controller(topology, args.port, security=security(args), host=args.host,
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
                          cubes=args.cubes, retention=parse_retention(args.retention),
                          profile=not args.no_profile,
                          profile_interval_s=args.profile_interval,
                          allow_code=args.allow_code)
    if args.state_dir:
        options.state_dir = Path(args.state_dir)
    guard = security(args)
    listeners = _push(args, options, guard)
    try:
        run_site(args.name, args.controller, security=guard, port=args.port,
                 host=args.host, advertise=args.advertise, options=options,
                 metrics_port=args.metrics_port, http_token=args.http_token)
    finally:
        for stop in listeners:
            stop()
    return 0


def _address(flag: str, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not port.isdigit():
        msg = f"{flag}: expected HOST:PORT, e.g. 127.0.0.1:5514, not {value!r}"
        raise ControlPlaneError(msg)
    return host or "127.0.0.1", int(port)


def _push(args: argparse.Namespace, options: SiteOptions,
          guard: Security) -> list[Callable[[], None]]:
    """The site's listeners for pushed logs (``--push-http``, ``--syslog-*``), spooled into
    its ``--input``: how to stop each, the spool last (what waits is written)."""
    given = {flag: value for flag, value in (
        ("--push-http", args.push_http), ("--syslog-udp", args.syslog_udp),
        ("--syslog-tcp", args.syslog_tcp), ("--syslog-relp", args.syslog_relp)) if value}
    syslog = "--syslog-relp, --syslog-tcp or --syslog-udp"
    for flag, value, listener in (("--syslog-key", args.syslog_key, syslog),
                                  ("--syslog-time", args.syslog_time, syslog),
                                  ("--push-token", args.push_token, "--push-http"),
                                  ("--push-tls", args.push_tls, "--push-http or " + syslog)):
        if value and not any(f in listener for f in given):
            msg = f"{flag}: the site takes no pushed logs it would apply to; give {listener}"
            raise ControlPlaneError(msg)
    if not given:
        return []
    if options.input_dir is None:
        msg = f"{', '.join(given)}: a site takes pushed logs into its --input folder; give one"
        raise ControlPlaneError(msg)
    addresses = {flag: _address(flag, value) for flag, value in given.items()}
    if args.push_tls and guard.tls_dir is None:
        msg = "--push-tls: the site has no TLS folder (--tls-dir) to take its certificate from"
        raise ControlPlaneError(msg)
    token = (required_token(guard, args.push_token, "--push-token")
             if "--push-http" in given else None)
    tls = ((guard.tls_dir / CERT_FILE, guard.tls_dir / KEY_FILE)
           if args.push_tls and guard.tls_dir is not None else None)
    spool = Spool(options.input_dir, options.state_dir / args.name / "push", site=args.name,
                  roll_s=args.push_roll, max_pending_bytes=args.push_max_pending)
    stops: list[Callable[[], None]] = []
    if "--push-http" in given:
        http = serve_push(addresses["--push-http"], spool, tls=tls, token=token,
                          max_request_bytes=args.push_max_request)
        stops.append(http.shutdown)
    intake = Intake(spool, key_field=args.syslog_key, time_field=args.syslog_time)
    stops += [listener.close for listener in serve_syslog(
        intake, udp=addresses.get("--syslog-udp"), tcp=addresses.get("--syslog-tcp"),
        relp=addresses.get("--syslog-relp"), tls=tls)]
    return [*stops, spool.close]


def _worker(args: argparse.Namespace) -> int:
    print(f"jetstream worker {args.site}/{args.server}: registering with {args.register}; "
          "Ctrl-C stops", file=sys.stderr)
    run_worker(args.site, args.server, args.register, security=security(args),
               host=args.host, port=args.port, parent_pid=args.parent_pid, epoch=args.epoch,
               deadline_s=args.window_deadline, allow_code=args.allow_code)
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


def _push_options(site: argparse.ArgumentParser) -> None:
    """A site's listeners for pushed logs, spooled into its --input (docs/deployment.md)."""
    group = site.add_argument_group(
        "pushed logs", "listeners that take logs pushed to the site into its --input folder, "
        "a file a --push-roll: JSON lines over HTTP, syslog over RELP, TCP or UDP (each off "
        "unless given; HOST defaults to loopback)")
    group.add_argument("--push-http", metavar="HOST:PORT",
                       help="take NDJSON POSTed by log shippers (gzip bodies too) into the "
                            "--input folder, answered 200 once on disk (default: off; "
                            "HOST defaults to loopback)")
    group.add_argument("--push-roll", type=positive_seconds, default=1.0, metavar="S",
                       help="how often pushed lines go into a file of --input, the longest a "
                            "push waits for its answer (default: 1s)")
    group.add_argument("--push-max-pending", type=size, default=64 << 20, metavar="SIZE",
                       help="bytes pushed and not on disk yet beyond which a push is answered "
                            "429 (default: 64MiB)")
    group.add_argument("--push-max-request", type=size, default=16 << 20, metavar="SIZE",
                       help="the largest push, decompressed (413 above; default: 16MiB)")
    group.add_argument("--syslog-udp", metavar="HOST:PORT",
                       help="take syslog datagrams (RFC 5424 or 3164, e.g. nginx's access_log "
                            "syslog:) whose text is a JSON object; what is dropped is counted "
                            "(default: off; see docs/deployment.md)")
    group.add_argument("--syslog-tcp", metavar="HOST:PORT",
                       help="take syslog over TCP (octet-counted or a message a line), "
                            "pushing back while the spool is full (default: off)")
    group.add_argument("--syslog-relp", metavar="HOST:PORT",
                       help="take syslog over RELP (rsyslog's omrelp), each message "
                            "acknowledged once on disk (default: off)")
    group.add_argument("--syslog-key", metavar="FIELD",
                       help="a payload field unique to a record (e.g. nginx's $request_id): "
                            "a message sent again is taken once (default: none)")
    group.add_argument("--syslog-time", metavar="FIELD",
                       help="fill this payload field, where a message lacks it, with its "
                            "syslog header's time in epoch ms (default: none)")
    group.add_argument("--push-tls", action="store_true",
                       help="serve the push over HTTPS, and syslog over TCP and RELP over "
                            "TLS, with the site's certificate")
    group.add_argument("--push-token", action="store_true",
                       help="ask pushes for the site's token (Authorization: Bearer)")


def register(commands: Any) -> None:
    """Add this group's commands to ``commands`` (the parser's subparsers)."""
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
    controller.add_argument("--port", type=int, default=7070,
                            help="the port its gRPC service listens on (default: 7070)")
    controller.add_argument("--host", default="127.0.0.1",
                            help="the address it listens on (default: 127.0.0.1)")
    controller.add_argument("--heartbeat-interval", type=float, default=2.0, metavar="S",
                            help="how often sites report (default: 2s)")
    controller.add_argument("--heartbeat-timeout", type=float, default=6.0, metavar="S",
                            help="a site silent this long is dead (default: 6s)")
    controller.add_argument("--state-dir", metavar="DIR",
                            help="keep the queries and their results here, so that a "
                                 "restarted controller takes them up again (default: "
                                 "in memory only)")
    metrics_option(controller)
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
    security_options(controller)
    controller.set_defaults(run=_controller)

    site = commands.add_parser("site", help="run a site controller")
    site.add_argument("--name", required=True, help="the site's name in the topology")
    controller_option(site)
    site.add_argument("--port", type=int, default=0, help="listen port (default: any free)")
    site.add_argument("--host", default="127.0.0.1",
                      help="the address it listens on (default: 127.0.0.1)")
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
    site.add_argument("--trigger", type=positive_seconds, default=SiteOptions.trigger_s,
                      metavar="S", help="the live local stage reads new files this often "
                                        f"(default: {SiteOptions.trigger_s:g}s)")
    site.add_argument("--batch-hold", type=seconds_or_zero, default=SiteOptions.batch_hold_s,
                      metavar="S", help="a new file waits up to this long for the next to "
                                        "share a micro-batch, unless its records may close "
                                        "a window; 0: each trigger reads what landed "
                                        f"(default: {SiteOptions.batch_hold_s:g}s)")
    site.add_argument("--warm-up", type=seconds_or_zero, default=SiteOptions.warm_up_s,
                      metavar="S", help="before a live local stage starts, stream made-up "
                                        "records through a copy of it for this long, so "
                                        "that its first windows do not wait for the JVM "
                                        "to compile; 0: off "
                                        f"(default: {SiteOptions.warm_up_s:g}s)")
    site.add_argument("--no-profile", action="store_true",
                      help="do not measure each degradation level on the links' own windows: "
                           "their policies plan with the levels' nominal sizes and errors "
                           "(for comparison; profiles are on by default)")
    site.add_argument("--profile-interval", type=seconds_or_zero,
                      default=SiteOptions.profile_interval_s, metavar="S",
                      help="measure a link's profile on at most one window this often (each "
                           "costs the site a tenth of a second to seconds of CPU); 0: one "
                           f"window in {PROFILE_EVERY} (default: "
                           f"{SiteOptions.profile_interval_s:g}s)")
    site.add_argument("--read-files", choices=READ_FILES, default=ReadFiles.mode,
                      help="what becomes of an --input file once every live query here has "
                           "read it: moved to STATE_DIR/<site>/archive/, deleted, or kept in "
                           "--input (a replayed input is always kept; default: "
                           f"{ReadFiles.mode})")
    site.add_argument("--archive-retention", type=archive_retention, metavar="DURATION",
                      default=ReadFiles.retention_s,
                      help="archived files older than this are deleted, e.g. 12h, 7d "
                           f"(default: {format_duration(int(ReadFiles.retention_s * 1000))})")
    site.add_argument("--archive-max-bytes", type=size, metavar="SIZE",
                      default=ReadFiles.max_bytes,
                      help="the archive's bound: past it the oldest files are deleted, e.g. "
                           f"500M, 20G (default: {ReadFiles.max_bytes // 2**30}G)")
    site.add_argument("--allow-code", action="store_true",
                      help="run the map steps of the plans it is given: their Python "
                           "functions travel pickled, so whoever can submit runs code on "
                           "this site (default: off; such a plan is refused at submit, and "
                           "by this site if it gets one; jetstream run and demo turn it on)")
    _push_options(site)
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
    metrics_option(site)
    security_options(site)
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
    worker.add_argument("--host", default="127.0.0.1",
                        help="the address it listens on (default: 127.0.0.1)")
    worker.add_argument("--parent-pid", type=int, default=0, metavar="PID",
                        help="end when this process ends (the site that started it)")
    worker.add_argument("--epoch", type=int, default=0, metavar="N",
                        help="how many times this server's worker started before: its "
                             "results replace theirs (default: 0)")
    worker.add_argument("--window-deadline", type=float, metavar="S",
                        help="its site's --window-deadline (default: the query's "
                             "max_latency, else 10s)")
    worker.add_argument("--allow-code", action="store_true",
                        help="run the map steps of the partitions it is given, as its site "
                             "does (its site passes this when started with --allow-code)")
    security_options(worker)
    worker.set_defaults(run=_worker)
