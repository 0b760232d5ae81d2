"""Which degradation levels a query gets, and what each one ships."""

from __future__ import annotations

import subprocess
import sys

import jetstream as js
from jetstream.approx.holistic import SketchSize
from jetstream.approx.items import ItemsSketch
from jetstream.approx.levels import Encoding, Ranking, heaviest, ladder, ranking
from jetstream.approx.policy import LinkPolicy
from jetstream.approx.truncate import exact_partial
from jetstream.rewrite import distributed, partial_aggregate

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
GROUPED = LOGS.window(js.tumbling("10s")).group_by("domain")


def query(top: js.Stream) -> js.Query:
    return distributed(js.Query("q", top))


def test_a_top_k_by_a_count_or_sum_can_degrade() -> None:
    assert ranking(query(GROUPED.agg(n=js.count()).top_k(10, by="n"))) == Ranking(10, "n")
    by_bytes = query(GROUPED.agg(b=js.sum("bytes")).top_k(3, by="b"))
    assert ranking(by_bytes) == Ranking(3, "b", integral=True)
    by_kb = query(GROUPED.agg(kb=js.sum(js.col("bytes") / 1024)).top_k(3, by="kb"))
    assert ranking(by_kb) == Ranking(3, "kb", integral=False)
    assert ranking(query(GROUPED.agg(m=js.avg("bytes")).top_k(3, by="m"))) is None
    assert ranking(query(GROUPED.agg(n=js.count()))) is None


def names(rank: Ranking | None, top: js.Query | None = None) -> list[str]:
    return [lv.name for lv in ladder(rank, partial_aggregate(top) if top else None).levels]


def test_the_ladder_goes_from_exact_to_truncations_to_sketches() -> None:
    steps = ladder(Ranking(10, "n"))
    levels = steps.levels
    assert [lv.name for lv in levels] == ["exact", "top 320", "top 80", "top 20",
                                          "sketch of 24", "sketch of 12"]
    assert steps.encoding(levels[1]) == Encoding(keep=320)
    assert steps.encoding(levels[4]) == Encoding(lg_max_k=5)
    LinkPolicy(levels, window_s=1.0)  # heaviest to lightest, exact to coarsest
    # Float sums are not countable by a sketch; small k leaves no sketch lighter than top 2k.
    assert names(Ranking(10, "kb", integral=False))[-1] == "top 20"
    assert names(Ranking(3, "n"))[-1] == "top 6"
    assert names(None) == ["exact"]


def test_a_query_without_a_top_k_keeps_its_heaviest_keys_by_a_count_or_a_sum() -> None:
    counts = query(GROUPED.agg(b=js.sum("bytes"), n=js.count()))
    assert heaviest(counts) == Ranking(0, "n")  # a count first: it is never negative
    assert heaviest(query(GROUPED.agg(b=js.sum("bytes")))) == Ranking(0, "b")
    assert heaviest(query(GROUPED.agg(m=js.avg("bytes")))) is None
    assert heaviest(query(GROUPED.agg(n=js.count()).top_k(3, by="n"))) is None  # ranked
    # A step after the aggregate would see lower bounds as values: no truncation then.
    assert heaviest(query(GROUPED.agg(n=js.count()).where(js.col("n") > 3))) is None
    steps = ladder(None, partial_aggregate(counts), heaviest(counts))
    assert [lv.name for lv in steps.levels] == ["exact", "heaviest 1024", "heaviest 256",
                                                "heaviest 64"]
    assert steps.encoding(steps.levels[3]) == Encoding(keep=64)
    LinkPolicy(steps.levels, window_s=1.0)
    both = query(GROUPED.agg(n=js.count(), users=js.count_distinct("client_ip")))
    steps = ladder(None, partial_aggregate(both), heaviest(both))
    assert [lv.name for lv in steps.levels] == [
        "exact", "HLL 2^12", "heaviest 1024, HLL 2^12", "heaviest 256, HLL 2^12",
        "heaviest 64, HLL 2^12"]
    LinkPolicy(steps.levels, window_s=1.0)


def test_exact_distinct_counts_and_quantiles_step_down_to_hll_and_kll() -> None:
    distinct = query(GROUPED.agg(users=js.count_distinct("client_ip")))
    assert names(None, distinct) == ["exact", "HLL 2^12", "HLL 2^10"]
    slowest = query(GROUPED.agg(p90=js.quantile("latency_ms", 0.9)))
    assert names(None, slowest) == ["exact", "KLL k=200", "KLL k=64"]
    both = query(GROUPED.agg(n=js.count(), users=js.count_distinct("client_ip"),
                             p90=js.quantile("latency_ms", 0.9)).top_k(10, by="n"))
    steps = ladder(ranking(both), partial_aggregate(both))
    assert [lv.name for lv in steps.levels] == [
        "exact", "HLL 2^12, KLL k=200", "top 320, HLL 2^12, KLL k=200",
        "top 80, HLL 2^12, KLL k=200", "top 20, HLL 2^12, KLL k=200"]  # no items sketch
    # weighs less than 20 sketched rows
    assert steps.encoding(steps.levels[2]) == Encoding(keep=320, sketch=SketchSize(12, 200))
    for levels in (steps.levels, ladder(None, partial_aggregate(distinct)).levels):
        LinkPolicy(levels, window_s=1.0)  # heaviest to lightest, exact to coarsest
    # Nominal errors: HLL's at three standard deviations, KLL's rank error.
    assert [round(lv.error_bound, 3) for lv in steps.levels[:3]] == [0.0, 0.049, 0.049]


def test_degrade_ships_what_the_level_says() -> None:
    top = query(GROUPED.agg(n=js.count()).top_k(10, by="n"))
    aggregate, rank = partial_aggregate(top), ranking(top)
    rows = exact_partial([{"domain": f"d{i}", "n": 1000 - i} for i in range(500)])
    steps = ladder(rank, aggregate)
    levels = steps.levels
    assert steps.degrade(rows, aggregate, levels[0]) is rows
    cut = steps.degrade(rows, aggregate, levels[2])
    assert not isinstance(cut, ItemsSketch) and len(cut.rows) == 80 and cut.truncated
    sketch = steps.degrade(rows, aggregate, levels[4])
    assert isinstance(sketch, ItemsSketch)
    assert 0 < sketch.sketch.num_active_items <= 24


def test_a_sketch_levels_error_is_the_librarys() -> None:
    import datasketches

    from jetstream.approx.levels import _epsilon

    for lg in range(3, 27):
        assert _epsilon(lg) == datasketches.frequent_strings_sketch.get_epsilon_for_lg_size(lg)


def test_a_sender_that_makes_no_sketch_does_not_load_datasketches() -> None:
    """Building a ladder and a local stage's forms leaves the library (and numpy) unloaded:
    about 13 MB in each site and worker process of the demo."""
    code = ("import sys\n"
            "import jetstream as js\n"
            "from jetstream.approx.levels import ladder, ranking\n"
            "from jetstream.rewrite import distributed, partial_aggregate\n"
            "import jetstream.stage.forms, jetstream.stage.job, jetstream.dataplane.uplink\n"
            "logs = js.source('cdn_logs', schema=js.CDN_LOG_SCHEMA)\n"
            "q = distributed(js.Query('q', logs.window(js.tumbling('10s')).group_by('domain')"
            ".agg(n=js.count()).top_k(10, by='n')))\n"
            "assert len(ladder(ranking(q), partial_aggregate(q)).levels) > 3\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('datasketches', '_datasketches', 'numpy')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
