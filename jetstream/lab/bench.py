"""``jetstream bench``: JetStream-py against the backhaul baseline, on the same generated input.

In one run: generate CDN logs for every site (:mod:`jetstream.lab.loggen`); compute the reference
answer with ``js.run_local``; replay the logs through JetStream on a
:class:`~jetstream.control.launch.LocalCluster`; build the baseline a user would run instead
(each edge site's raw logs gzipped window by window and shipped to the root, where one plain
Spark Structured Streaming job computes the query, :mod:`jetstream.lab.baseline`); and time
the local stage against that plain job on the same records. The report gives, per window and
in total, the wide-area bytes of both, and the top-k accuracy of both against the reference.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from jetstream.aggtree.loader import load_topology
from jetstream.approx.levels import DegradationLevel, Ranking, ladder, ranking
from jetstream.approx.truncate import TopKBounds, exact_partial, top_k_bounds, truncate
from jetstream.control.launch import LocalCluster, replay
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.keydict import KeyDecoder, KeyEncoder
from jetstream.dataplane.merger import WindowMerger
from jetstream.dataplane.partials import PartialBatch, summarised
from jetstream.dsl import Query
from jetstream.lab.loggen import LogSpec, write_logs
from jetstream.local import run_local
from jetstream.operators import WindowAggregate
from jetstream.results import WindowResult
from jetstream.rewrite import distributed, site_part
from jetstream.stage.spark import REPLAY_SPARK_CONF

__all__ = ["WindowFigures", "run_bench", "through_levels", "top_k_accuracy"]

Row = dict[str, Any]
Window = tuple[int, int]

#: The baseline computes the CDN top-k: 10 s windows, the 10 busiest domains.
WINDOW_MS = 10_000
K = 10
#: Generated logs start here (a round 10 s), so that runs compare window by window.
START_MS = 1_767_225_600_000


@dataclass(frozen=True)
class WindowFigures:
    window_start: int
    raw_bytes: int  # raw CSV written at the edge sites (not the root) for this window
    backhaul_bytes: int  # the same, gzipped: what the baseline ships
    jetstream_bytes: int  # partials JetStream sent over the wide area
    #: The least any exact top-k could ship: each edge site's own top k rows, as batches
    #: with each link's keys coded across windows.
    lower_bound_bytes: int
    jetstream_exact: bool | None  # whether its result said it was exact (None: not given)
    jetstream_recall: float | None  # None: the system never gave this window
    jetstream_max_error: float | None  # largest relative error of a reported count
    backhaul_recall: float | None
    backhaul_max_error: float | None


def run_bench(topology: Path, query: Query, work: Path, *, duration_s: float,
              rate: float, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Run both systems on the same input; the report (also written to ``work/bench.json``)."""
    from jetstream.lab.baseline import top_domains
    from jetstream.stage.spark import session_builder, started

    layout = load_topology(topology)
    sites = [s.name for s in layout.sites if s.sources]
    edges = [s for s in sites if s != layout.root]
    inputs = work / "input"
    say(f"generating {duration_s:g}s of logs at {rate:g} records/s for {', '.join(sites)}")
    files = write_logs(inputs, sites, start_ms=START_MS, duration_s=duration_s, rate=rate,
                       spec=LogSpec(), seed=seed)
    say("the reference answer (js.run_local)")
    reference = {(r.window_start, r.window_end): r for r in run_local(query, inputs)}

    partials = _site_partials(query, inputs, sites)
    declared = _declared(topology, work / "topology.yaml", rate, partials)
    say(f"JetStream: replaying the logs through every site (the topology declaring "
        f"{rate:g} records/s and about {_keys_per_window(partials):,.0f} keys a window at "
        "each site, for the planner)")
    with LocalCluster(declared, inputs, replay=True, window_deadline_s=120,
                      logs=work / "logs", say=say) as cluster:
        ours = {(r.window_start, r.window_end): r
                for r in replay(cluster, query, timeout_s=900, say=lambda _: None)}

    say("baseline: gzip the edge sites' logs window by window, one Spark job at the root")
    raw, shipped = _ship_by_window(files, edges, work / "inbox")
    # The root site's Spark master and settings, as it replays (REPLAY_SPARK_CONF under its
    # spark_conf), for the backhaul's job and the timed local stage alike: neither is tuned
    # apart.
    root = layout.site(layout.root)
    spark = started(session_builder(root.master, "jetstream-bench",
                                    {**REPLAY_SPARK_CONF, **dict(root.spark_conf)}),
                    "the bench's baseline")  # this process has gRPC threads: see started
    spark.sparkContext.setLogLevel("ERROR")
    try:
        backhaul = top_domains(spark, work / "inbox", work / "backhaul-checkpoint", k=K)
        stage_seconds, stage_records = _time_local_stage(spark, query, inputs / layout.root, work)
    finally:
        spark.stop()

    least = _lower_bound(query, partials, edges)
    figures = []
    for window in sorted(reference):
        truth = reference[window].rows
        mine = ours.get(window)
        figures.append(WindowFigures(
            window[0], raw.get(window[0], 0), shipped.get(window[0], 0),
            mine.wan_bytes or 0 if mine else 0, least.get(window, 0),
            mine.exact if mine else None,
            *top_k_accuracy(truth, mine.rows if mine else None),
            *top_k_accuracy(truth, backhaul.windows.get(window))))
    report = {
        "topology": layout.name, "sites": sites, "root": layout.root, "duration_s": duration_s,
        "records_per_s_per_site": rate, "seed": seed,
        "windows": [asdict(f) for f in figures],
        "total": _totals(figures),
        "throughput_records_per_s": {
            "jetstream_local_stage": stage_records / stage_seconds,
            "backhaul_spark_job": backhaul.records / backhaul.seconds,
        },
    }
    say("accuracy per degradation level: every edge site's partials sent at each level")
    levels = _levels(query, partials, sites, layout.root, reference)
    report["levels"] = levels
    (work / "bench.json").write_text(json.dumps(report, indent=2))
    _plot(figures, work / "bytes.png")
    _plot_levels(levels, work / "levels.png")
    return report


#: Each (level, origin) link's key dictionary, both ends, kept from one window to the next.
Dictionaries = dict[tuple[str, str], tuple[KeyEncoder, KeyDecoder]]


def through_levels(partial: WindowAggregate, rank: Ranking, sent: Sequence[list[Row]],
                   local: list[Row] | None = None, dictionaries: Dictionaries | None = None
                   ) -> Iterator[tuple[DegradationLevel, int, TopKBounds]]:
    """For each degradation level of ``rank``: the wire bytes of sending each of ``sent`` (a
    site's partial rows of one window) at that level, and the top-k with bounds the root makes
    of them once decoded and merged with its own exact ``local`` rows. With
    ``dictionaries``, each link's keys are coded as a push stream codes them (pass the same
    dict for every window of a run)."""
    window = (0, 1)
    origins = [f"site{i}" for i in range(len(sent))]
    levels = ladder(rank, partial)
    for level in levels.levels:
        merger = WindowMerger(partial, [*origins, *(["root"] if local is not None else [])],
                              deadline_s=0)
        if local is not None:
            merger.add(PartialBatch("bench", window, "root", tuple(local)))
        size = 0
        for origin, rows in zip(origins, sent, strict=True):
            message = encode_batch(summarised(
                PartialBatch("bench", window, origin, ()),
                levels.degrade(exact_partial(rows), partial, level), level.index), partial)
            keys = None
            if dictionaries is not None:
                coder, keys = dictionaries.setdefault((level.name, origin),
                                                      (KeyEncoder(), KeyDecoder()))
                message = coder.encode(message)
            size += message.ByteSize()
            merger.add(decode_batch(message, partial, keys))
        (merged,) = merger.ready()
        yield level, size, top_k_bounds(merged.bounded, partial, rank.by, rank.k)


def _site_partials(query: Query, inputs: Path, sites: list[str]
                   ) -> dict[str, dict[Window, list[Row]]]:
    """Each site's exact partial rows per window (the reference executor's)."""
    site_query, _ = site_part(distributed(query))
    return {site: {(r.window_start, r.window_end): r.rows
                   for r in run_local(site_query, inputs / site)} for site in sites}


def _lower_bound(query: Query, partials: dict[str, dict[Window, list[Row]]],
                 edges: list[str]) -> dict[Window, int]:
    """Per window, the bytes of each edge site's own top k rows (the fewest an exact top-k
    can ship: any site may hold a key of the answer), through the wire format with each
    link's key dictionary kept across windows."""
    optimized = distributed(query)
    rank = ranking(optimized)
    _, partial = site_part(optimized)
    out: dict[Window, int] = {}
    for site in edges:
        keys = KeyEncoder()
        for window, rows in sorted(partials[site].items()):
            if rank is not None:
                rows = list(truncate(rows, partial, rank.by, rank.k).rows)
            message = keys.encode(encode_batch(PartialBatch("bench", window, site,
                                                            tuple(rows)), partial))
            out[window] = out.get(window, 0) + message.ByteSize()
    return out


def _keys_per_window(partials: dict[str, dict[Window, list[Row]]]) -> float:
    counts = [len(rows) for windows in partials.values() for rows in windows.values()]
    return statistics.median(counts) if counts else 0.0


def _declared(topology: Path, out: Path, rate: float,
              partials: dict[str, dict[Window, list[Row]]]) -> Path:
    """``topology`` with each source declaring the generated load (``rate`` records/s, the
    median keys a window), as an operator would declare it, so that the planner plans for
    it; written to ``out``."""
    document = yaml.safe_load(topology.read_text(encoding="utf-8"))
    keys = max(1, round(_keys_per_window(partials)))
    for site in document.get("sites", []):
        for source in site.get("sources", []):
            source.update(events_per_s=rate, distinct_keys=keys)
    out.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return out


def _levels(query: Query, partials: dict[str, dict[Window, list[Row]]], sites: list[str],
            root: str, reference: dict[Window, WindowResult]) -> list[dict[str, Any]]:
    """Per level: the edge sites' wide-area bytes over all windows, and the worst window's
    top-10 recall and count error against the reference."""
    optimized = distributed(query)
    rank = ranking(optimized)
    if rank is None:
        return []
    _, partial = site_part(optimized)
    edges = [s for s in sites if s != root]
    dictionaries: Dictionaries = {}
    out: dict[str, dict[str, Any]] = {}
    for window, result in sorted(reference.items()):
        levels = through_levels(partial, rank, [partials[s].get(window, []) for s in edges],
                                partials[root].get(window, []), dictionaries)
        for level, size, top in levels:
            got = [{**row, rank.by: lb} for row, lb in zip(top.rows, top.lb, strict=True)]
            recall, error = top_k_accuracy(result.rows, got)
            entry = out.setdefault(level.name, {"level": level.name, "wan_bytes": 0,
                                                "min_recall": 1.0, "max_error": 0.0})
            entry["wan_bytes"] += size
            entry["min_recall"] = min(entry["min_recall"], recall or 0.0)
            entry["max_error"] = max(entry["max_error"], error or 0.0)
    return list(out.values())


def _ship_by_window(files: dict[str, list[Path]], edges: list[str], inbox: Path
                    ) -> tuple[dict[int, int], dict[int, int]]:
    """Every site's records as gzipped CSV per window in ``inbox``; per window start, the raw
    and gzipped bytes of the edge sites (the root's own logs do not cross the wide area)."""
    inbox.mkdir(parents=True, exist_ok=True)
    raw: dict[int, int] = {}
    shipped: dict[int, int] = {}
    for site, paths in files.items():
        header = ""
        by_window: dict[int, list[str]] = {}
        for path in paths:
            with path.open() as f:
                header = f.readline()
                for line in f:
                    start = int(line.split(",", 1)[0]) // WINDOW_MS * WINDOW_MS
                    by_window.setdefault(start, []).append(line)
        for start, lines in sorted(by_window.items()):
            text = (header + "".join(lines)).encode()
            packed = gzip.compress(text, compresslevel=6)
            (inbox / f"{site}-{start}.csv.gz").write_bytes(packed)
            if site in edges:
                raw[start] = raw.get(start, 0) + len(text)
                shipped[start] = shipped.get(start, 0) + len(packed)
    return raw, shipped


def _time_local_stage(spark: Any, query: Any, folder: Path, work: Path) -> tuple[float, int]:
    """Seconds the JetStream local stage takes over one site's logs, and their records."""
    from jetstream.rewrite import distributed
    from jetstream.stage.job import LocalStage

    stage = LocalStage(spark, distributed(query), folder,
                       checkpoint_dir=work / "stage-checkpoint",
                       quarantine_dir=work / "stage-quarantine", emit=lambda *_: None)
    start = time.perf_counter()
    stage.run_available()
    return time.perf_counter() - start, stage.stats.records_in


def top_k_accuracy(truth: list[dict[str, Any]], got: list[dict[str, Any]] | None
              ) -> tuple[float | None, float | None]:
    """Recall of the true top-k domains, and the largest relative error of a count reported
    for a true top-k domain; None, None for a window the system did not give."""
    if got is None:
        return None, None
    if not truth:
        return 1.0, 0.0
    true_counts = {r["domain"]: r["requests"] for r in truth}
    reported = {r["domain"]: r["requests"] for r in got}
    hits = [d for d in true_counts if d in reported]
    error = max((abs(reported[d] - true_counts[d]) / true_counts[d] for d in hits), default=0.0)
    return len(hits) / len(true_counts), error


def _totals(figures: list[WindowFigures]) -> dict[str, Any]:
    raw = sum(f.raw_bytes for f in figures)
    shipped = sum(f.backhaul_bytes for f in figures)
    ours = sum(f.jetstream_bytes for f in figures)
    least = sum(f.lower_bound_bytes for f in figures)
    return {
        "raw_bytes": raw, "backhaul_bytes": shipped, "jetstream_bytes": ours,
        "lower_bound_bytes": least,
        "jetstream_vs_backhaul": shipped / ours if ours else None,
        "jetstream_vs_raw": raw / ours if ours else None,
        "jetstream_over_lower_bound": ours / least if least else None,
        "jetstream_windows_exact": sum(bool(f.jetstream_exact) for f in figures),
        **_worst("jetstream", [(f.jetstream_recall, f.jetstream_max_error) for f in figures]),
        **_worst("backhaul", [(f.backhaul_recall, f.backhaul_max_error) for f in figures]),
    }


def _worst(system: str, accuracy: list[tuple[float | None, float | None]]) -> dict[str, Any]:
    given = [(r, e) for r, e in accuracy if r is not None and e is not None]
    return {f"{system}_min_recall": min((r for r, _ in given), default=None),
            f"{system}_max_error": max((e for _, e in given), default=None),
            f"{system}_windows_missing": len(accuracy) - len(given)}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot(figures: list[WindowFigures], path: Path) -> None:
    plt = _pyplot()
    t = [(f.window_start - START_MS) / 1000 for f in figures]
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, values in [("raw logs at the edge sites", [f.raw_bytes for f in figures]),
                          ("backhaul (gzip)", [f.backhaul_bytes for f in figures]),
                          ("JetStream-py", [f.jetstream_bytes for f in figures]),
                          ("lower bound (top k rows a site)",
                           [f.lower_bound_bytes for f in figures])]:
        ax.plot(t, [max(v, 1) for v in values], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("window start (s)")
    ax.set_ylabel("wide-area bytes per window")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)



def _plot_levels(levels: list[dict[str, Any]], path: Path) -> None:
    plt = _pyplot()
    names = [entry["level"] for entry in levels]
    fig, bytes_axis = plt.subplots(figsize=(8, 4))
    bytes_axis.bar(names, [max(entry["wan_bytes"], 1) for entry in levels], color="tab:blue",
                   alpha=0.6, label="wide-area bytes (all windows)")
    bytes_axis.set_yscale("log")
    bytes_axis.set_ylabel("wide-area bytes")
    bytes_axis.set_xlabel("degradation level of every edge site's link")
    recall_axis = bytes_axis.twinx()
    recall_axis.plot(names, [entry["min_recall"] for entry in levels], color="tab:red",
                     marker="o", label="top-10 recall (worst window)")
    recall_axis.plot(names, [1 - entry["max_error"] for entry in levels], color="tab:green",
                     marker="s", label="1 - largest count error (worst window)")
    recall_axis.set_ylim(0, 1.05)
    recall_axis.set_ylabel("accuracy")
    fig.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
