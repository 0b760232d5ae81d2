"""Which degradation levels a query gets, and what each one ships."""

from __future__ import annotations

import jetstream as js
from jetstream.approx.items import ItemsSketch
from jetstream.approx.levels import Encoding, Ranking, degrade, encoding, levels_for, ranking
from jetstream.approx.policy import LinkPolicy
from jetstream.approx.truncate import exact_partial
from jetstream.runtime import distributed, partial_aggregate

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


def test_the_ladder_goes_from_exact_to_truncations_to_sketches() -> None:
    levels = levels_for(Ranking(10, "n"))
    assert [lv.name for lv in levels] == ["exact", "top 320", "top 80", "top 20",
                                          "sketch of 24", "sketch of 12"]
    assert encoding(levels[1], Ranking(10, "n")) == Encoding(keep=320)
    assert encoding(levels[4], Ranking(10, "n")) == Encoding(lg_max_k=5)
    LinkPolicy(levels, window_s=1.0)  # heaviest to lightest, exact to coarsest
    # Float sums are not countable by a sketch; small k leaves no sketch lighter than top 2k.
    assert [lv.name for lv in levels_for(Ranking(10, "kb", integral=False))][-1] == "top 20"
    assert [lv.name for lv in levels_for(Ranking(3, "n"))][-1] == "top 6"
    assert [lv.name for lv in levels_for(None)] == ["exact"]


def test_degrade_ships_what_the_level_says() -> None:
    top = query(GROUPED.agg(n=js.count()).top_k(10, by="n"))
    aggregate, rank = partial_aggregate(top), ranking(top)
    rows = exact_partial([{"domain": f"d{i}", "n": 1000 - i} for i in range(500)])
    levels = levels_for(rank)
    assert degrade(rows, aggregate, rank, levels[0]) is rows
    cut = degrade(rows, aggregate, rank, levels[2])
    assert not isinstance(cut, ItemsSketch) and len(cut.rows) == 80 and cut.truncated
    sketch = degrade(rows, aggregate, rank, levels[4])
    assert isinstance(sketch, ItemsSketch)
    assert 0 < sketch.sketch.num_active_items <= 24
