"""Merging partials from sites, then the root's final step, against the reference executor."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import jetstream as js
from jetstream.dataplane.codec import decode_batch, encode_batch
from jetstream.dataplane.merger import MergedWindow, WindowMerger
from jetstream.dataplane.partials import ENDED, PartialBatch
from jetstream.local import finish_from_partials
from jetstream.operators import TopK, WindowAggregate
from jetstream.rewrite import distributed, site_part
from tests.conftest import log

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
SITES = ("ams", "sfo", "sin")


def split(query: js.Query) -> tuple[js.Query, js.Query, WindowAggregate]:
    """The query as the sites run it, the part each site runs (up to its partial), and that
    partial."""
    optimized = distributed(query)
    site, partial = site_part(optimized)
    return optimized, site, partial


def site_batches(site_query: js.Query, partial: WindowAggregate, site: str,
                 events: list[dict[str, Any]]) -> list[PartialBatch]:
    """What a site sends: its partial rows per window, through the wire format and back."""
    out = []
    for result in js.run_local(site_query, events):
        batch = PartialBatch("q", (result.window_start, result.window_end), site,
                             tuple(result.rows), events=len(result.rows))
        out.append(decode_batch(encode_batch(batch, partial), partial))
    return out


QUERIES = [
    LOGS.where(js.col("status") < 500).window(js.tumbling("10s"), watermark="1m")
    .group_by("domain").agg(n=js.count(), kb=js.sum(js.col("bytes") / 1024),
                            mean=js.avg("latency_ms")).top_k(2, by="n"),
    LOGS.window(js.sliding("10s", every="5s"), watermark="1m").group_by("pop")
    .agg(lo=js.min("latency_ms"), hi=js.max("bytes"), n=js.count()).where(js.col("n") > 1),
    LOGS.window(js.tumbling("20s"), watermark="1m").agg(users=js.approx_count_distinct(
        "client_ip"), urls=js.top_k("url", 2)),
]

EVENTS = st.lists(st.builds(
    lambda ts, d, site, status, b: log(ts, d, pop=site, status=status, bytes=b,
                                       client_ip=f"10.0.0.{b % 7}", url=f"/u{b % 3}",
                                       latency_ms=float(b % 97)),
    st.integers(0, 50_000), st.sampled_from(["a.com", "b.com", "c.com"]),
    st.sampled_from(SITES), st.sampled_from([200, 404, 503]), st.integers(0, 5000)),
    max_size=60)


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.sampled_from(range(len(QUERIES))))
def test_merged_site_partials_give_the_reference_results(events: list[dict[str, Any]],
                                                         which: int) -> None:
    query = js.Query("q", QUERIES[which])
    optimized, site_query, partial = split(query)
    merger = WindowMerger(partial, SITES, deadline_s=60, clock=lambda: 0.0)
    sent = {site: site_batches(site_query, partial, site, [e for e in events if e["pop"] == site])
            for site in SITES}
    for site, batches in sent.items():
        for batch in batches:
            merger.add(batch)
        merger.progress(site, 0, ended=True)  # a site with no rows for a window sends none
    merged = merger.ready()
    assert merger.finished
    assert all(m.complete and not m.correction for m in merged)
    assert_reference_results(query, optimized, merged, events)


def assert_reference_results(query: js.Query, optimized: js.Query, merged: list[MergedWindow],
                             events: list[dict[str, Any]]) -> None:
    """The merged windows, finished, equal ``run_local`` over ``events``: row for row in a
    top-k's rank order, as sets otherwise."""
    got = finish_from_partials(optimized, {m.window: list(m.rows) for m in merged})
    want = js.run_local(query, events)
    assert [(r.window_start, r.exact) for r in got] == [(r.window_start, r.exact) for r in want]
    ranked = any(isinstance(query.plan().op(n), TopK) for n in query.plan().topological())
    for g, w in zip(got, want, strict=True):
        if ranked:  # top_k rows keep their rank order
            assert g.rows == w.rows
        else:
            assert sorted(map(repr, g.rows)) == sorted(map(repr, w.rows))


def test_a_missing_child_goes_out_late_and_incomplete_then_corrected() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    now = [0.0]
    merger = WindowMerger(partial, SITES, deadline_s=5, clock=lambda: now[0])
    batches = {site: site_batches(site_query, partial, site, [log(1_000, f"{site}.com")])[0]
               for site in SITES}
    merger.add(batches["ams"])
    merger.add(batches["sfo"])
    assert merger.ready() == []  # sin has not reported and the deadline has not passed
    now[0] = 5.0
    (first,) = merger.ready()
    assert not first.complete and first.missing == {"sin"} and len(first.rows) == 2
    assert merger.ready() == []
    merger.add(batches["sin"])  # late: merged in as a correction
    (fixed,) = merger.ready()
    assert fixed.correction and fixed.complete and len(fixed.rows) == 3


def test_an_input_that_leaves_is_not_waited_for_and_corrects_when_back() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    merger = WindowMerger(partial, SITES, deadline_s=60, clock=lambda: 0.0)
    batches = {site: site_batches(site_query, partial, site, [log(1_000, f"{site}.com")])[0]
               for site in SITES}
    merger.add(batches["ams"])
    merger.add(batches["sfo"])
    assert merger.ready() == []
    merger.set_inputs(["ams", "sfo"])  # a re-plan: sin is dead
    (first,) = merger.ready()  # not waited for, but missing: not complete, not final
    assert first.covers == {"ams", "sfo"} and first.missing == {"sin"}
    assert not first.complete and not first.final
    merger.set_inputs(SITES)  # sin is back, with the window it had
    merger.add(batches["sin"])
    (fixed,) = merger.ready()
    assert fixed.correction and fixed.covers == set(SITES) and len(fixed.rows) == 3
    assert fixed.complete and fixed.final


def test_a_settled_window_is_kept_for_a_while_then_later_batches_are_refused() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    now = [0.0]
    merger = WindowMerger(partial, ["ams", "sfo"], deadline_s=5, clock=lambda: now[0],
                          retain_s=60)
    (ams,) = site_batches(site_query, partial, "ams", [log(1_000)])
    (sfo,) = site_batches(site_query, partial, "sfo", [log(2_000)])
    merger.add(ams)
    merger.progress("ams", 10_000)
    merger.progress("sfo", 10_000)
    (alone,) = merger.ready()
    assert alone.complete and alone.covers == {"ams"}
    now[0] = 30.0
    merger.add(sfo)  # sfo's watermark lied (it restarted): still in time to correct
    (fixed,) = merger.ready()
    assert fixed.correction and fixed.covers == {"ams", "sfo"}
    now[0] = 100.0
    assert merger.ready() == []  # settled for 60 s now: forgotten
    merger.add(dataclasses.replace(sfo, revision=1))
    assert merger.ready() == [] and merger.too_late == 1  # not a window of sfo's part alone


def test_a_batch_for_a_forgotten_window_corrects_what_the_inbox_gives_back() -> None:
    """Past ``retain_s`` a window is forgotten; a batch for it is merged with the batches the
    window held (``recall``: the site's inbox), and the window goes out again, corrected,
    under the revision after the last one it went out as."""
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    now = [0.0]
    (ams,) = site_batches(site_query, partial, "ams", [log(1_000)])
    (sfo,) = site_batches(site_query, partial, "sfo", [log(2_000)])
    (later,) = site_batches(site_query, partial, "sfo", [log(2_000), log(3_000, "b.com")])
    merger = WindowMerger(partial, ["ams", "sfo"], deadline_s=5, clock=lambda: now[0],
                          retain_s=60, recall=lambda window: ([ams, sfo], 0))
    merger.add(ams)
    merger.add(sfo)
    merger.progress("ams", 10_000)
    merger.progress("sfo", 10_000)
    (first,) = merger.ready()
    now[0] = 100.0
    assert merger.ready() == []  # forgotten
    merger.add(dataclasses.replace(later, revision=1))  # sfo's late records, a correction
    (fixed,) = merger.ready()
    assert (fixed.revision, fixed.covers, merger.too_late) == (1, {"ams", "sfo"}, 0)
    assert sorted(r["domain"] for r in fixed.rows) == ["a.com", "b.com"]
    assert fixed.events == first.events + 1


def test_a_batch_delivered_twice_counts_once_and_a_revision_replaces_it() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    merger = WindowMerger(partial, ["ams"], deadline_s=5, clock=lambda: 0.0)
    (batch,) = site_batches(site_query, partial, "ams", [log(1_000)])
    merger.add(batch)
    merger.add(batch)  # delivered twice
    (merged,) = merger.ready()
    assert merged.rows[0]["n"] == 1 and merged.revision == 0
    (two,) = site_batches(site_query, partial, "ams", [log(1_000), log(2_000)])
    merger.add(dataclasses.replace(two, revision=1))  # a corrected window from below
    (fixed,) = merger.ready()
    assert fixed.rows[0]["n"] == 2 and fixed.revision == 1 and fixed.correction


def test_a_window_waits_only_for_inputs_whose_watermark_has_not_passed_it() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    merger = WindowMerger(partial, SITES, deadline_s=60, clock=lambda: 0.0)
    (batch,) = site_batches(site_query, partial, "ams", [log(1_000)])
    merger.add(batch)
    merger.progress("sfo", 10_000)  # sfo closed [0, 10s) without a record in it
    assert merger.ready() == [] and merger.watermark is None
    merger.progress("sin", ENDED)  # sin is idle
    (merged,) = merger.ready()
    assert merged.complete and merged.covers == {"ams"}
    assert not merger.finished  # nobody has ended
    merger.progress("ams", 10_000)
    assert merger.watermark == 10_000


def test_warnings_from_below_go_up_once_each() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    merger = WindowMerger(partial, ["ams", "sfo"], deadline_s=5, clock=lambda: 0.0)
    for site, warnings in [("ams", ("link ams -> dc: too thin",)),
                           ("sfo", ("link ams -> dc: too thin", "link sfo -> dc: too"))]:
        (batch,) = site_batches(site_query, partial, site, [log(1_000)])
        merger.add(dataclasses.replace(batch, warnings=warnings))
    (merged,) = merger.ready()
    assert merged.warnings == ("link ams -> dc: too thin", "link sfo -> dc: too")


def test_a_window_sent_early_waits_at_the_root_for_its_inputs_watermark() -> None:
    """The root takes an early batch as final only once its input's watermark passes the
    window; an edge forwards it at once, marked early, and not again if nothing changes."""
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    (first,) = site_batches(site_query, partial, "ams", [log(1_000)])
    (more,) = site_batches(site_query, partial, "ams", [log(1_000), log(2_000, "b.com")])
    early = dataclasses.replace(first, early=True)
    root = WindowMerger(partial, ["ams"], deadline_s=60, clock=lambda: 0.0)
    edge = WindowMerger(partial, ["ams"], deadline_s=60, clock=lambda: 0.0, forward_early=True)
    for merger in (root, edge):
        merger.add(early)
        merger.progress("ams", 5_000)  # not past the window yet
    assert root.ready() == []
    (forwarded,) = edge.ready()
    assert forwarded.early and forwarded.revision == 0 and len(forwarded.rows) == 1
    root.progress("ams", 10_000, received_ms=123_456)
    (final,) = root.ready()
    assert final.revision == 0 and not final.early and len(final.rows) == 1
    assert final.closed_at_ms == 123_456  # closed when ams had what moved it past the end
    assert root.received_ms == 123_456
    edge.progress("ams", 10_000)
    assert edge.ready() == []  # the edge's watermark will tell its parent

    root = WindowMerger(partial, ["ams"], deadline_s=60, clock=lambda: 0.0)
    edge = WindowMerger(partial, ["ams"], deadline_s=60, clock=lambda: 0.0, forward_early=True)
    for merger in (root, edge):  # a record came before the watermark: sent at close, whole
        merger.add(early)
        assert len(merger.ready()) == (merger is edge)
        merger.add(dataclasses.replace(more, revision=1))
    (closed,) = root.ready()
    assert closed.revision == 0 and not closed.early and len(closed.rows) == 2
    (again,) = edge.ready()
    assert not again.early and again.revision == 1 and len(again.rows) == 2


def test_an_early_window_whose_input_left_or_is_late_goes_out() -> None:
    _, site_query, partial = split(js.Query("q", QUERIES[0]))
    now = [0.0]
    root = WindowMerger(partial, ["ams", "sfo"], deadline_s=5, clock=lambda: now[0])
    for site in ("ams", "sfo"):
        (batch,) = site_batches(site_query, partial, site, [log(1_000, f"{site}.com")])
        root.add(dataclasses.replace(batch, early=True))
    root.progress("ams", 10_000)
    assert root.ready() == []
    root.set_inputs(["ams"])  # sfo left (a re-plan): its batch is as final as it will get
    (out,) = root.ready()
    assert out.complete and len(out.rows) == 2
    lonely = WindowMerger(partial, ["ams"], deadline_s=5, clock=lambda: now[0])
    (batch,) = site_batches(site_query, partial, "ams", [log(1_000)])
    lonely.add(dataclasses.replace(batch, early=True))
    now[0] = 9.0  # sent early, nobody has closed it: the deadline counts from a deadline on
    assert lonely.ready() == []
    now[0] = 10.0  # out with what it has, nothing missing
    (late,) = lonely.ready()
    assert late.early and not late.missing

    now[0] = 0.0
    pair = WindowMerger(partial, ["ams", "sfo"], deadline_s=5, clock=lambda: now[0])
    pair.add(dataclasses.replace(batch, early=True))
    now[0] = 3.0
    pair.progress("sfo", 10_000)  # sfo closes the window, with nothing in it: the clock starts
    now[0] = 7.9
    assert pair.ready() == []
    now[0] = 8.0
    (late,) = pair.ready()
    assert late.early and not late.missing


Message = PartialBatch | tuple[str, str]  # a batch, or ("ended", site)


def early_messages(site_query: js.Query, partial: WindowAggregate,
                   events: list[dict[str, Any]], rng: Any) -> dict[str, list[Message]]:
    """What each site sends, in order: each window early with some of its records, then, if
    any came after, the whole window as the next revision; then that it ended."""
    messages: dict[str, list[Message]] = {}
    for site in SITES:
        mine = [e for e in events if e["pop"] == site]
        whole = site_batches(site_query, partial, site, mine)
        cut = rng.randrange(len(mine) + 1)
        some = {b.window: b for b in site_batches(site_query, partial, site, mine[:cut])}
        out: list[Message] = []
        for batch in whole:
            part = some.get(batch.window)
            if part is not None and part.rows != batch.rows:
                out += [dataclasses.replace(part, early=True),
                        dataclasses.replace(batch, revision=1)]
            else:
                out.append(dataclasses.replace(batch, early=True))
        messages[site] = [*out, ("ended", site)]
    return messages


def deliver(merger: WindowMerger, message: Message) -> None:
    """Give ``merger`` a site's batch, or tell it the site ended."""
    if isinstance(message, tuple):
        merger.progress(message[1], 0, ended=True)
    else:
        merger.add(message)


@settings(max_examples=60, deadline=None)
@given(EVENTS, st.sampled_from(range(len(QUERIES))), st.randoms(use_true_random=False))
def test_early_windows_through_a_tree_give_the_reference_results(
        events: list[dict[str, Any]], which: int, rng: Any) -> None:
    """Each site sends each window early with some of its records, then, if any came after,
    the whole window as the next revision, then its watermark; an edge merger forwards two
    sites' windows to the root, sending on what it has as it has it, its watermark after.
    Whatever the order of the sites' messages, the root puts out each window once, after
    every watermark passed it, equal to the reference."""
    query = js.Query("q", QUERIES[which])
    optimized, site_query, partial = split(query)
    edge = WindowMerger(partial, ["ams", "sfo"], deadline_s=60, clock=lambda: 0.0,
                        forward_early=True)
    root = WindowMerger(partial, ["edge", "sin"], deadline_s=60, clock=lambda: 0.0)
    messages = early_messages(site_query, partial, events, rng)
    merged: list[MergedWindow] = []

    def edge_tick() -> None:
        watermark = edge.watermark
        for window in edge.ready():
            root.add(PartialBatch("q", window.window, "edge", window.rows,
                                  revision=window.revision, early=window.early))
        if watermark is not None:
            root.progress("edge", watermark, ended=watermark == ENDED)

    queues = {site: list(msgs) for site, msgs in messages.items()}
    while any(queues.values()):
        site = rng.choice([s for s, q in queues.items() if q])
        message = queues[site].pop(0)
        if site == "sin":
            deliver(root, message)
        else:
            deliver(edge, message)
            if rng.random() < 0.5:
                edge_tick()
        for window in root.ready():
            assert not window.correction, "a window went out before it was final"
            merged.append(window)
    edge_tick()
    merged += root.ready()
    assert root.finished
    assert all(m.complete and not m.correction for m in merged)
    assert_reference_results(query, optimized, merged, events)
