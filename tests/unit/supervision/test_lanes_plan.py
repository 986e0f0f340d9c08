"""supervision/lanes.py's plan under explicit model control: lanes only for the models served from the start."""
from __future__ import annotations

from pathlib import Path

from ringserve.common.settings import Settings
from ringserve.supervision.lanes import plan_lanes
from tests.support.lifecycle_models import build_versioned


def test_explicit_mode_plans_lanes_for_what_load_model_names_and_lane_0_takes_later_loads(tmp_path: Path):
    for name in ("a", "b", "c"):
        build_versioned(tmp_path, name, weight_bytes=64)
    explicit = dict(model_repository=str(tmp_path), lanes="model", model_control_mode="explicit")

    assert [lane.models for lane in plan_lanes(Settings(**explicit, load_models=("c",)))] == [()]
    lanes = plan_lanes(Settings(**explicit, load_models=("a", "c")))
    assert [(lane.models, lane.excludes) for lane in lanes] == [((), ("c",)), (("c",), ())]
    assert len(plan_lanes(Settings(**explicit, load_models=("*",)))) == 3
