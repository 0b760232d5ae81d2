"""What a site's local stages are, without Spark: a stage per input of a union that reads a
source the site holds, each an input of the site's merge, and the folder each reads."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import jetstream as js
from jetstream import col
from jetstream.aggtree.planner import Fragment
from jetstream.dataplane.run import merge_inputs
from jetstream.errors import PlanError
from jetstream.operators import Where
from jetstream.rewrite import distributed
from jetstream.stage.check import check_stage, local_inputs, source_of
from jetstream.stage.inputs import StageInput, source_folder

LOGS = js.source("cdn_logs", schema=js.CDN_LOG_SCHEMA)
ORIGIN = js.source("origin_logs", schema=js.CDN_LOG_SCHEMA)


def counted(stream: js.Stream, name: str = "q") -> js.Query:
    return distributed(js.Query(name, stream.window(js.tumbling("10s")).group_by("pop")
                                .agg(n=js.count())))


def test_a_union_of_two_sources_is_a_stage_per_source_at_a_site_holding_both() -> None:
    query = counted(LOGS.where(col("status") < 500).union(ORIGIN))
    chains = check_stage(query)
    assert [source_of(c).name for c in chains] == ["cdn_logs", "origin_logs"]
    assert isinstance(chains[0][1], Where) and len(chains[1]) == 3  # source, window, partial
    both = local_inputs("ams", chains, ["cdn_logs", "origin_logs"])
    assert [name for name, _ in both] == ["ams[cdn_logs]", "ams[origin_logs]"]
    # A site holding one of them runs its stage under its own name, as for any query.
    assert [name for name, _ in local_inputs("sfo", chains, ["origin_logs"])] == ["sfo"]
    assert local_inputs("sin", chains, []) == []
    root = Fragment("q", "ams", sources=("cdn_logs", "origin_logs"), children=("sfo", "sin"))
    assert merge_inputs(root, query) == ["ams[cdn_logs]", "ams[origin_logs]", "sfo", "sin"]


def test_a_source_read_by_two_branches_is_two_stages() -> None:
    query = counted(LOGS.where(col("status") < 300).union(LOGS.where(col("status") >= 500)))
    names = [name for name, _ in local_inputs("ams", check_stage(query), ["cdn_logs"])]
    assert names == ["ams[cdn_logs]", "ams[cdn_logs#2]"]


def test_a_union_after_the_windows_is_refused() -> None:
    windowed = [s.window(js.tumbling("10s")).group_by("pop").agg(n=js.count())
                for s in (LOGS, ORIGIN)]
    with pytest.raises(PlanError, match="the local stage runs one partial aggregate, the plan "
                                        "has 2"):
        check_stage(distributed(js.Query("u", windowed[0].union(windowed[1]))))


def test_each_source_reads_its_own_folder_or_the_input_folder_if_it_is_the_only_one(
        tmp_path: Path) -> None:
    assert source_folder(tmp_path, "cdn_logs", alone=True) == tmp_path
    assert source_folder(tmp_path, "cdn_logs", alone=False) is None
    (tmp_path / "cdn_logs").mkdir()
    assert source_folder(tmp_path, "cdn_logs", alone=True) == tmp_path / "cdn_logs"
    assert source_folder(tmp_path, "cdn_logs", alone=False) == tmp_path / "cdn_logs"
    assert source_folder(tmp_path / "absent", "cdn_logs", alone=True) is None
    assert source_folder(None, "cdn_logs", alone=True) is None


def test_an_input_whose_triggers_only_list_the_folder_goes_idle() -> None:
    """Spark's trigger is active every trigger interval, listing the folder, with no records:
    that is not a micro-batch running, and the input goes idle (its windows close)."""
    calls = iter(range(10**6))

    class Stream:
        isActive = True

        @property
        def status(self) -> dict[str, Any]:  # every other look finds the listing under way
            return {"isTriggerActive": next(calls) % 2 == 0, "isDataAvailable": False}

    flushed = threading.Event()
    stage = SimpleNamespace(stats=SimpleNamespace(records_in=5), start=lambda _: Stream(),
                            failure=None, watermark=None,
                            flush=lambda idle: flushed.set(), stop=lambda: None,
                            received_ms=0)
    ended: list[int] = []
    query = counted(LOGS)
    runner = StageInput("ams", query, check_stage(query)[0], None, Path("."), replay=False,
                        trigger_s=0.25, idle_s=0.5,
                        hand_on=lambda *_: None, progress=lambda _, w, *__: ended.append(w),
                        on_batch=lambda *_: None, on_failure=lambda _: None)
    thread = threading.Thread(target=runner._run_live, args=(stage,), daemon=True)
    started = time.monotonic()
    thread.start()
    assert flushed.wait(10), "the input never went idle"
    runner.stop(5)
    assert time.monotonic() - started < 5
    assert ended  # and said so: every window it had is closed
