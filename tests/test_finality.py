"""Final or provisional (jetstream.finality): a merged window is final only when nothing it
was built from may still change, and then it equals the reference."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream import finality
from jetstream.dataplane.merger import MergedWindow, WindowMerger
from jetstream.dataplane.partials import ENDED, PartialBatch
from jetstream.local import finish_from_partials
from tests.conftest import log
from tests.test_merger import EVENTS, QUERIES, deliver, early_messages, site_batches, split


def test_a_window_out_at_its_deadline_is_provisional_then_final_once_complete() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    now = [0.0]
    root = WindowMerger(partial, ["ams", "sfo"], deadline_s=5, clock=lambda: now[0])
    batches = {site: site_batches(site_query, partial, site, [log(1_000, f"{site}.com")])[0]
               for site in ("ams", "sfo")}
    root.add(batches["ams"])
    now[0] = 5.0
    (first,) = root.ready()
    assert not first.final and first.provisional == (finality.DEADLINE,)
    root.add(batches["sfo"])
    (fixed,) = root.ready()
    assert fixed.final and fixed.revision == 1 and len(fixed.rows) == 2


def test_an_early_batch_out_at_the_deadline_is_provisional_until_its_watermark_passes(
        ) -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    now = [0.0]
    root = WindowMerger(partial, ["ams"], deadline_s=5, clock=lambda: now[0])
    (batch,) = site_batches(site_query, partial, "ams", [log(1_000)])
    root.add(dataclasses.replace(batch, early=True))
    now[0] = 10.0
    (first,) = root.ready()
    assert first.provisional == (finality.EARLY,)
    assert root.ready() == []  # nothing changed
    root.progress("ams", 10_000)
    (final,) = root.ready()  # the same rows, now final, under the next revision
    assert final.final and final.revision == 1 and final.rows == first.rows
    assert root.ready() == []


def test_a_window_without_an_input_a_re_plan_dropped_is_final_once_it_passes_it() -> None:
    """A site taken for dead is not waited for, but a window without its data is not final:
    once it is back, its watermark past the window (it had nothing there) makes it final."""
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    root = WindowMerger(partial, ["ams", "sfo"], deadline_s=60, clock=lambda: 0.0)
    (batch,) = site_batches(site_query, partial, "ams", [log(1_000)])
    root.add(batch)
    root.set_inputs(["ams"])  # sfo is dead
    (first,) = root.ready()
    assert first.provisional == (finality.DEADLINE,) and first.missing == {"sfo"}
    root.set_inputs(["ams", "sfo"])  # back, and past the window with nothing in it
    assert root.ready() == []
    root.progress("sfo", 10_000)
    (final,) = root.ready()
    assert final.final and final.rows == first.rows and final.revision == 1


def test_a_provisional_batch_from_below_keeps_the_window_provisional() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    root = WindowMerger(partial, ["edge"], deadline_s=5, clock=lambda: 0.0)
    (batch,) = site_batches(site_query, partial, "edge", [log(1_000)])
    root.add(dataclasses.replace(batch, complete=False))
    (out,) = root.ready()
    assert out.provisional == (finality.INCOMPLETE_INPUT,)
    root.add(dataclasses.replace(batch, revision=1))
    (again,) = root.ready()
    assert again.final


def test_unknown_reasons_are_refused() -> None:
    assert finality.provisional([finality.APPROXIMATE, finality.DEADLINE]) == [
        finality.DEADLINE, finality.APPROXIMATE]
    with pytest.raises(ValueError, match="unknown"):
        finality.provisional(["because"])


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.sampled_from(range(len(QUERIES))), st.randoms(use_true_random=False))
def test_a_window_marked_final_equals_the_reference_and_never_changes(
        events: list[dict[str, Any]], which: int, rng: Any) -> None:
    """Sites send windows early, then whole under the next revision; an edge forwards two of
    them; deadlines pass at random, so windows go out without inputs or with early batches.
    Whatever goes out final at the root equals the reference and is never changed after;
    once every site has ended, every window's last result is final."""
    query = js.Query("q", QUERIES[which])
    optimized, site_query, partial = split(query)
    now = [0.0]
    edge = WindowMerger(partial, ["ams", "sfo"], deadline_s=2, clock=lambda: now[0],
                        forward_early=True)
    root = WindowMerger(partial, ["edge", "sin"], deadline_s=2, clock=lambda: now[0])
    messages = early_messages(site_query, partial, events, rng)
    want = {(r.window_start, r.window_end): r.rows for r in js.run_local(optimized, events)}
    last: dict[tuple[int, int], MergedWindow] = {}

    def edge_tick() -> None:
        watermark = edge.watermark
        for window in edge.ready():
            root.add(PartialBatch("q", window.window, "edge", window.rows,
                                  revision=window.revision, early=window.early,
                                  complete=window.complete))
        if watermark is not None:
            root.progress("edge", watermark, ended=watermark == ENDED)

    def root_tick() -> None:
        for window in root.ready():
            before = last.get(window.window)
            if before is not None and before.final:
                assert rows(window) == rows(before), "a final window changed"
            if window.final:
                assert rows(window) == want.get(window.window, []), "final but not right"
            last[window.window] = window

    def rows(window: MergedWindow) -> list[Any]:
        (result, *_) = finish_from_partials(optimized, {window.window: list(window.rows)}) \
            or [js.WindowResult("q", *window.window)]
        return sorted(map(repr, result.rows))

    want = {w: sorted(map(repr, r)) for w, r in want.items()}
    queues = {site: list(msgs) for site, msgs in messages.items()}
    while any(queues.values()):
        site = rng.choice([s for s, q in queues.items() if q])
        deliver(root if site == "sin" else edge, queues[site].pop(0))
        if rng.random() < 0.3:
            now[0] += rng.choice([0.5, 1.0, 3.0])
        if rng.random() < 0.5:
            edge_tick()
        root_tick()
    edge_tick()
    root_tick()
    assert all(m.final for m in last.values()), {w: m.provisional for w, m in last.items()}
    assert {w: rows(m) for w, m in last.items() if rows(m)} == want


def test_a_window_whose_rounds_cannot_settle_it_is_provisional() -> None:
    """TPUT's rounds rank by sums that cannot be negative; a window with a negative one goes
    out as the inputs sent it, provisional, not taken as settled."""
    from jetstream.approx.levels import Ranking
    from jetstream.dataplane.asks import Answerer
    from tests.test_rounds import AGGREGATE, KB

    ranked = Ranking(1, "kb")
    merger = WindowMerger(AGGREGATE, ["a", "b"], deadline_s=600, rounds=ranked)
    held = {"a": {"d1": 5.0, "d2": 3.0, "d3": 1.0}, "b": {"d1": -9.0, "d2": 2.0}}
    for name, kbs in held.items():  # a answers in rounds; b, with a negative sum, whole
        rows = tuple({"domain": d, "requests": 1, "kb": KB.add(KB.create(), kb)}
                     for d, kb in kbs.items())
        batch = Answerer(AGGREGATE, ranked, keep_s=60).first(
            PartialBatch("q", (0, 1), name, rows))
        assert batch.rounds == (name == "a")
        merger.add(batch)
        merger.progress(name, 1)
    (out,) = merger.ready()
    assert finality.UNSETTLED in out.provisional and not out.final


def test_a_querys_own_sketch_is_final_and_a_degraded_level_is_not() -> None:
    from jetstream.dataplane.finish import _finality

    query = js.Query("q", js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
                     .window(js.tumbling("10s"), watermark="5s")
                     .agg(clients=js.approx_count_distinct("client_ip")))
    _, site_query, partial = split(query)
    root = WindowMerger(partial, ["ams"], deadline_s=5)
    root.add(site_batches(site_query, partial, "ams", [log(1_000, "a.com")])[0])
    root.progress("ams", ENDED, ended=True)
    (merged,) = root.ready()
    (result,) = finish_from_partials(js.optimize(query), {merged.window: list(merged.rows)})
    assert not result.exact  # a sketch's estimate, as the user asked
    assert _finality(result, merged, {"ams"}) == {"final": True, "provisional": []}
    summarised = dataclasses.replace(merged, error_bound=0.2)  # what a degraded level sends
    assert _finality(result, summarised, {"ams"}) == {
        "final": False, "provisional": [finality.APPROXIMATE]}
