"""The ``jetstream`` command line: explain, local, demo, and its errors."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jetstream as js
from jetstream import cli
from jetstream.cli import deployment, main
from jetstream.dataplane.options import SiteOptions
from jetstream.queryfile import load_query
from jetstream.stage.archive import ReadFiles
from tests.test_planner import two_sites_yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cdn_topk.py"
SAMPLE_LOGS = ROOT / "examples" / "logs"


def test_explain_prints_the_plan_and_the_rewrites(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--query", str(EXAMPLE), "--partitions", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("query cdn-topk  (slo: max_latency=3s, max_error=0.01)")
    assert "\nlogical plan\n" in out and "\nrewrites\n" in out and "\nrewritten plan\n" in out
    assert "split_aggregates  split `aggregate by domain" in out
    assert "top_k 10 by requests (partial)" in out


@pytest.mark.parametrize("max_error", [0.05, 0])
def test_explain_plans_a_thin_link_at_a_level_the_slo_allows_or_refuses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], max_error: float) -> None:
    topology = tmp_path / "thin.yaml"
    topology.write_text(two_sites_yaml(distinct_keys=50_000, bandwidth="100kbit", latency="1s"))
    path = tmp_path / "q.py"
    path.write_text("import jetstream as js\n"
                    "logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)\n"
                    "query = js.Query('q', logs.window(js.tumbling('10s')).group_by('domain')"
                    ".agg(requests=js.count()).top_k(10, by='requests'), slo=js.SLO("
                    f"max_latency='5s', max_error={max_error}))\n")
    code = main(["explain", "--query", str(path), "--topology", str(topology)])
    out, err = capsys.readouterr()
    if max_error:
        assert code == 0, err
        assert "pop: local stage -> dc:" in out and "starts at level 'top 20'" in out
    else:
        assert code == 1
        assert "link pop-dc is over capacity" in err and "max_error=0 allows none" in err


def test_explain_starts_a_thin_link_at_a_declared_roll_up_without_max_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = tmp_path / "thin.yaml"
    topology.write_text(two_sites_yaml(distinct_keys=5_000, bandwidth="100kbit", latency="1s"))
    path = tmp_path / "q.py"
    path.write_text("import jetstream as js\n"
                    "logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)\n"
                    "query = js.Query('q', logs.window(js.tumbling('10s')).group_by('url', "
                    "rollup={'url': js.col('url').url_domain()}).agg(requests=js.count()))\n")
    code = main(["explain", "--query", str(path), "--topology", str(topology)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "starts at level 'rolled up'" in out, out


def test_optimized_example_gives_the_same_results(tmp_path: Path) -> None:
    query = load_query(EXAMPLE)
    optimized = js.optimize(query, partitions=3)
    assert js.run_local(optimized, SAMPLE_LOGS) == js.run_local(query, SAMPLE_LOGS)


def test_local_runs_the_example_on_the_sample_logs(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "out.jsonl"
    assert main(["local", "--query", str(EXAMPLE), "--input", str(SAMPLE_LOGS),
                 "--output", str(out_file)]) == 0
    results = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(results) >= 3
    for result in results:
        assert set(result) == {"query", "window_start", "window_end", "rows", "exact",
                               "error_bound", "sites_reporting", "sites_expected", "latency_s",
                               "wan_bytes", "revision", "warnings", "missing_sites", "history",
                               "rolled_up", "final", "provisional"}
        assert result["final"] and result["provisional"] == []
        assert result["window_end"] - result["window_start"] == 10_000
        assert len(result["rows"]) <= 10
        requests = [row["requests"] for row in result["rows"]]
        assert requests == sorted(requests, reverse=True)
    report = capsys.readouterr().err
    assert "0 late, 1 rejected" in report
    assert "rejected 1: wrong field count" in report


def test_bad_query_file_gets_a_clear_error(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import jetstream as js\n"
                   "logs = js.source('l', schema=js.CDN_LOG_SCHEMA)\n"
                   "query = js.Query('q', logs.where(js.col('stauts') < 1)"
                   ".window(js.tumbling('1s')).agg(n=js.count()))\n")
    assert main(["explain", "--query", str(bad)]) == 1
    assert "where: unknown column 'stauts'" in capsys.readouterr().err

    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert main(["explain", "--query", str(empty)]) == 1
    assert "must assign a js.Query to the name `query`, found nothing" in capsys.readouterr().err

    broken = tmp_path / "broken.py"
    broken.write_text("query = (\n")
    assert main(["explain", "--query", str(broken)]) == 1
    assert "syntax error" in capsys.readouterr().err

    assert main(["explain", "--query", str(tmp_path / "missing.py")]) == 1
    assert "no such query file" in capsys.readouterr().err

    assert main(["local", "--query", str(EXAMPLE), "--input", str(tmp_path / "nope")]) == 1
    assert "--input" in capsys.readouterr().err


def test_console_script_help_and_the_live_demo() -> None:
    """The demo a new user sees: a complete window (every site, wholly after the log feed
    began), and on the way out no stack trace in any process's log."""
    jetstream = Path(sys.executable).parent / "jetstream"
    command = [str(jetstream)] if jetstream.exists() else [sys.executable, "-m", "jetstream"]
    help_text = subprocess.run([*command, "--help"], capture_output=True, text=True, check=True)
    for name in ("explain", "local", "run", "results", "demo", "gen-logs", "bench", "level"):
        assert name in help_text.stdout
    demo = subprocess.run([*command, "demo", "--duration", "5", "--rate", "50",
                           "--no-dashboard"], capture_output=True, text=True, check=True,
                          timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert "sites up: 3/3" in demo.stderr and "live generated CDN logs" in demo.stderr
    assert "the first complete window came" in demo.stderr, demo.stderr
    shown = re.search(r"(\d+) complete windows shown", demo.stderr)
    assert shown and int(shown.group(1)) >= 1, demo.stderr
    assert "wide area:" in demo.stderr and "records generated" in demo.stderr
    feed = re.search(r"the log feed began at (\d\d:\d\d:\d\d\.\d\d\d) UTC", demo.stderr)
    assert feed, demo.stderr
    # The last view: complete windows of the generated domains, every one from every site
    # and opening at or after the feed began (HH:MM:SS compares as text within a day).
    final = demo.stdout[demo.stdout.rindex("Ctrl-C stops the demo") - 6000:]
    headings = re.findall(r"cdn-topk \[(\d\d:\d\d:\d\d), [^)]*\) UTC — (\d)/(\d) sites",
                          final)
    assert headings, demo.stdout
    for opens, reporting, expected in headings:
        assert reporting == expected == "3" and f"{opens}.000" >= feed.group(1), headings
    assert ".example.com" in final
    assert "sfo -> ams: exact" in final and "sin -> ams: exact" in final
    missing = subprocess.run([*command], capture_output=True, text=True)
    assert missing.returncode == 2 and "COMMAND" in missing.stderr
    logs = Path(re.findall(r"logs and state in (\S+)", demo.stderr)[-1]) / "logs"
    traced = {log.name: log.read_text(errors="replace") for log in sorted(logs.glob("*.log"))}
    traced = {name: text for name, text in traced.items()
              if any(t in text for t in ("Traceback", "Exception in thread", "\tat org.apache"))}
    assert not traced, "\n".join(f"{name}:\n{text[-4000:]}" for name, text in traced.items())
    # The demo's sites archive the files every query there has read (--read-files archive).
    assert list((logs / "state").glob("*/archive/*/*")), sorted((logs / "state").rglob("*"))




def test_a_results_table_column_reads_alike() -> None:
    from rich.console import Console

    from jetstream.control.results_view import render_window
    from jetstream.results import WindowResult

    rows = [{"domain": "a.com", "requests": 12345, "kb": 136780.39},
            {"domain": "b.com", "requests": 7, "kb": 77943.5},
            {"domain": "c.com", "requests": 1000, "kb": 21364.141}]
    console = Console(record=True, width=120, force_terminal=False)
    console.print(render_window(WindowResult("q", 0, 10_000, rows)))
    screen = console.export_text()
    for cell in ("136,780.390", "77,943.500", "21,364.141", "12,345", "1,000"):
        assert cell in screen, screen


def test_a_degraded_rows_aggregate_bounds_read_as_intervals() -> None:
    from rich.console import Console

    from jetstream.control.results_view import render_window
    from jetstream.results import WindowResult

    rows = [{"domain": "a.com", "ms": 30.25, "lb": 10, "ub": 14, "complete": False,
             "bounds": [{"aggregate": "ms", "lb": 12.1, "ub": 480.0},
                        {"aggregate": "slowest", "lb": 2500}]}]
    console = Console(record=True, width=160, force_terminal=False)
    console.print(render_window(WindowResult("q", 0, 10_000, rows, exact=False,
                                             error_bound=0.2)))
    assert "ms [12.1, 480]; slowest [2,500, ?]" in console.export_text()


def test_a_rolled_up_window_says_to_what() -> None:
    from rich.console import Console

    from jetstream.control.results_view import render_window
    from jetstream.results import WindowResult

    console = Console(record=True, width=160, force_terminal=False)
    console.print(render_window(WindowResult("q", 0, 10_000, [{"url": "a.com", "n": 3}],
                                             exact=False, rolled_up={"url": "url_domain(url)"})))
    assert "± 0.00%, rolled up: url to url_domain(url)" in console.export_text()


def test_results_table_shows_the_newest_windows_and_how_complete_they_are() -> None:
    from rich.console import Console

    from jetstream.control.results_view import follow_table
    from jetstream.results import WindowResult

    def result(start: int, n: int, revision: int = 0) -> WindowResult:
        return WindowResult("cdn-topk", start, start + 10_000,
                            [{"domain": "a.example.com", "requests": n, "kb": 1.5}],
                            sites_reporting=2 + revision, sites_expected=3, latency_s=0.4,
                            wan_bytes=880, revision=revision,
                            warnings=["link sfo -> dc: too thin"] if revision else [])

    console = Console(record=True, width=120, force_terminal=False)
    shown = [result(w * 10_000, w) for w in range(5)] + [result(40_000, 99, revision=1)]
    assert follow_table(shown, console) == 6
    screen = console.export_text()
    final = screen[screen.rindex("cdn-topk [00:00:20"):]  # the last frame: 3 newest windows
    assert "00:00:00" not in final and "00:00:40, 00:00:50) UTC" in final
    assert "3/3 sites" in final and "correction 1" in final and "99" in final
    assert "880 B wide-area" in final and "a.example.com" in final
    assert "warning: link sfo -> dc: too thin" in final


def test_status_watch_redraws_until_stopped_and_says_when_the_controller_is_away() -> None:
    import threading

    from rich.console import Console

    from jetstream.control.status_view import watch_status
    from jetstream.errors import ControlPlaneError
    from jetstream.v1 import control_pb2 as pb

    stop, asked = threading.Event(), []

    def fetch() -> pb.StatusResponse:
        asked.append(1)
        if len(asked) == 2:
            raise ControlPlaneError("controller at 127.0.0.1:7070: UNAVAILABLE")
        if len(asked) == 3:
            stop.set()
        return pb.StatusResponse(topology="local-3dc", root="ams", sites=[pb.SiteStatus(
            name="sfo", kind="datacenter", address="127.0.0.1:7101", alive=True,
            seconds_since_heartbeat=0.5)], links=[pb.LinkStatus(
                a="sfo", b="ams", bandwidth_bps=1e9, planned_bytes_per_s=1e3,
                utilisation=8e-6)])

    console = Console(record=True, width=120, force_terminal=True)  # every frame, recorded
    assert watch_status(fetch, interval_s=0.01, console=console, stop=stop) == 3
    screen = console.export_text()
    assert "sites of local-3dc (root ams)" in screen and "alive (0.5s ago)" in screen
    assert "controller unreachable: controller at 127.0.0.1:7070: UNAVAILABLE" in screen
    assert "Ctrl-C stops" in screen


def test_run_refuses_a_missing_query_or_input_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--query", str(tmp_path / "nope.py"), "--input", str(SAMPLE_LOGS)]) == 1
    assert "nope.py: no such query file" in capsys.readouterr().err
    assert main(["run", "--query", str(EXAMPLE), "--input", str(tmp_path / "none")]) == 1
    assert "not a directory (it should hold one folder per site)" in capsys.readouterr().err


def test_results_output_appends_every_result_as_it_passes(tmp_path: Path) -> None:
    from jetstream.cli.operate import _also_to
    from jetstream.results import WindowResult

    sink = tmp_path / "out.jsonl"
    sink.write_text('{"earlier": true}\n')
    passed = [WindowResult("q", w, w + 10, [{"n": w}]) for w in (0, 10)]
    assert list(_also_to(iter(passed), str(sink))) == passed
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    assert lines[0] == {"earlier": True}
    assert [line["window_start"] for line in lines[1:]] == [0, 10]


def test_site_spark_settings_are_repeatable_and_the_last_of_a_key_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sites: list[dict[str, object]] = []
    monkeypatch.setattr(deployment, "run_site", lambda name, controller, **kw: sites.append(kw))
    args = cli.parser().parse_args([
        "site", "--name", "ams", "--insecure", "--spark-conf", "spark.driver.memory=2g",
        "--spark-conf=spark.sql.shuffle.partitions=1", "--spark-conf", "spark.driver.memory=3g",
        "--spark-conf", "spark.executorEnv.OPTS=-Da=b"])
    assert args.run(args) == 0
    [site] = sites
    options = site["options"]
    assert isinstance(options, SiteOptions)
    assert options.spark_conf == {"spark.driver.memory": "3g",
                                  "spark.sql.shuffle.partitions": "1",
                                  "spark.executorEnv.OPTS": "-Da=b"}
    args = cli.parser().parse_args(["site", "--name", "ams", "--insecure"])
    assert args.spark_conf is None  # the topology's and the defaults, then


@pytest.mark.parametrize(("flag", "message"), [
    ("spark.driver.memory", "expected KEY=VALUE, e.g. spark.driver.memory=2g, got "
                            "'spark.driver.memory'"),
    ("driver.memory=2g", "'driver.memory' is not a Spark setting; its name starts with 'spark.'"),
    ("spark.master=local[2]", "the master is not a setting: use spark_master (or "
                              "--spark-master)"),
])
def test_a_bad_site_spark_setting_is_refused_before_anything_starts(
        flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["site", "--name", "ams", "--insecure", "--spark-conf", flag])
    assert exit_.value.code == 2
    assert f"argument --spark-conf: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--archive-retention", "0s", "expected a duration above 0, such as 12h or 7d, not '0s' "
                                  "(to keep no read file, use --read-files delete)"),
    ("--archive-retention", "7", "archive retention: '7' is not a duration"),
    ("--archive-max-bytes", "0", "expected a size in bytes above 0, such as 500M or 20G, "
                                 "not '0'"),
    ("--archive-max-bytes", "lots", "expected a size in bytes above 0"),
])
def test_a_bad_archive_setting_is_refused_before_anything_starts(
        flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parser().parse_args(["site", "--name", "ams", "--insecure", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


def test_an_archive_setting_reaches_the_site(monkeypatch: pytest.MonkeyPatch) -> None:
    sites: list[dict[str, object]] = []
    monkeypatch.setattr(deployment, "run_site", lambda name, controller, **kw: sites.append(kw))
    args = cli.parser().parse_args(["site", "--name", "ams", "--insecure",
                                     "--archive-retention", "12h", "--archive-max-bytes", "1.5G"])
    assert args.run(args) == 0
    options = sites.pop()["options"]
    assert isinstance(options, SiteOptions)
    assert options.read_files == ReadFiles("archive", 12 * 3600, int(1.5 * 2**30))


def test_a_sites_warm_up_is_its_flag_zero_for_none_and_never_negative(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    sites: list[dict[str, object]] = []
    monkeypatch.setattr(deployment, "run_site", lambda name, controller, **kw: sites.append(kw))
    for given, want in [([], SiteOptions.warm_up_s), (["--warm-up", "0"], 0.0),
                        (["--warm-up", "2.5"], 2.5)]:
        args = cli.parser().parse_args(["site", "--name", "ams", "--insecure", *given])
        assert args.run(args) == 0
        options = sites.pop()["options"]
        assert isinstance(options, SiteOptions) and options.warm_up_s == want
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(["site", "--name", "ams", "--insecure", "--warm-up", bad])
        assert (f"argument --warm-up: expected a number of seconds, 0 or more, not {bad!r}"
                in capsys.readouterr().err)


def test_every_option_with_a_default_says_it_in_its_help() -> None:
    top = cli.parser()
    [commands] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    silent = []
    for name, command in commands.choices.items():
        for action in command._actions:
            if (not action.option_strings or action.required
                    or action.default in (None, False, [], argparse.SUPPRESS)):
                continue  # a flag off, or an option whose absence means something of its own
            if "default" not in (action.help or ""):
                silent.append(f"jetstream {name} {'/'.join(action.option_strings)}")
    assert not silent, silent


def test_a_query_file_is_given_with_query_and_the_old_spelling_still_works(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(EXAMPLE)]) == 0  # as explain, submit and history took it
    captured = capsys.readouterr()
    assert captured.out.startswith("query cdn-topk")
    assert f"warning: give the query file as --query {EXAMPLE}" in captured.err
    for given in ([], [str(EXAMPLE), "--query", str(EXAMPLE)]):
        with pytest.raises(SystemExit) as refused:
            main(["explain", *given])
        assert refused.value.code == 2
        assert re.search(r"explain: (give the query file: --query|the query file given "
                         "twice)", capsys.readouterr().err)
    for command in ("explain", "submit", "history", "run", "local", "demo", "emulate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--query QUERY.py" in capsys.readouterr().out, command


def test_the_lab_adds_its_commands_and_a_broken_add_on_takes_none_of_ours(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import EntryPoint

    [lab] = [e for e in cli.entry_points(group=cli.COMMANDS_GROUP) if e.name == "lab"]
    assert lab.value == "jetstream.lab.commands:register"
    broken = EntryPoint("broken", "jetstream.no_such_module:register", cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken, lab])
    assert main(["explain", "--query", str(EXAMPLE)]) == 0
    assert "the commands of broken (jetstream.no_such_module:register) did not load" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["demo", "--help"])  # the lab's, still there
    assert "--replay" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "message"), [
    (["--syslog-key", "request_id"], "--syslog-key: the site takes no pushed logs it would "
                                     "apply to; give --syslog-relp, --syslog-tcp or --syslog-udp"),
    (["--syslog-time", "ts", "--push-http", "127.0.0.1:1"], "--syslog-time: the site takes no"),
    (["--push-token", "--syslog-tcp", "127.0.0.1:1"], "--push-token: the site takes no pushed "
                                                       "logs it would apply to; give --push-http"),
    (["--push-tls"], "--push-tls: the site takes no pushed logs"),
    (["--syslog-relp", "localhost:relp"], "--syslog-relp: expected HOST:PORT, e.g. 127.0.0.1"),
    (["--syslog-udp", "127.0.0.1:1", "--input", ""], "a site takes pushed logs into its "
                                                     "--input folder; give one"),
])
def test_a_push_option_with_nothing_to_apply_to_is_refused_before_anything_starts(
        flags: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(deployment, "run_site", lambda *a, **k: pytest.fail("it started"))
    assert cli.main(["site", "--name", "ams", "--insecure", "--input", str(tmp_path),
                     "--state-dir", str(tmp_path / "state"), *flags]) == 1
    assert message in capsys.readouterr().err
