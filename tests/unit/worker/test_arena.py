"""worker/arena.py: which runs carry ONNX Runtime's arena shrinkage (the memory test is
tests/integration/test_client_limits.py, on a real worker)."""
from __future__ import annotations

import numpy as np

from ringserve.worker.arena import OUTSIZED_FACTOR, OUTSIZED_MIN_BYTES, RECENT_RUNS, SHRINK_OPTION, OutsizedRuns


def feeds(nbytes: int) -> dict[str, np.ndarray]:
    return {"ids": np.zeros(nbytes // 8, np.int64)}


def test_usual_runs_keep_the_arena_and_an_outsized_one_shrinks_it():
    runs = OutsizedRuns()
    usual = OUTSIZED_MIN_BYTES // 2
    assert [runs.options_for(feeds(usual)) for _ in range(10)] == [None] * 10

    options = runs.options_for(feeds(usual * OUTSIZED_FACTOR * 2))

    assert options is runs.shrink and options.get_run_config_entry(SHRINK_OPTION) == "cpu:0"
    assert runs.options_for(feeds(usual)) is None  # the next usual run keeps what it has
    assert runs.shrunk == 1


def test_a_small_models_runs_never_shrink_however_they_vary():
    runs = OutsizedRuns()
    sizes = [64, 64, 64, OUTSIZED_MIN_BYTES // 2]  # 8192x the usual, but under the floor
    assert [runs.options_for(feeds(n)) for n in sizes] == [None] * 4


def test_a_model_whose_runs_grow_for_good_stops_shrinking_once_they_are_the_usual():
    runs = OutsizedRuns()
    for _ in range(RECENT_RUNS):
        runs.options_for(feeds(1 << 20))
    big = [runs.options_for(feeds(32 << 20)) is not None for _ in range(RECENT_RUNS)]
    assert big[0] and not big[-1]  # the first ones shrink, the median catches up within RECENT_RUNS runs
    assert runs.usual_bytes() == 32 << 20
