"""common/vocabulary.py: each family of strings once, and the named constants elsewhere among them."""
from __future__ import annotations

from typing import get_args

from ringserve.common import exits, vocabulary


def test_the_reason_constants_are_the_reason_literals():
    assert set(get_args(vocabulary.KillReason)) == {
        exits.REASON_HUNG, exits.REASON_BATCH_TIMEOUT, *exits.CALL_TIMEOUT_REASONS.values()}
    assert set(get_args(vocabulary.StopReason)) == {exits.REASON_STOPPING, exits.REASON_RETIRED}
    assert set(get_args(vocabulary.ReplaceReason)) == {exits.REASON_RELOAD, exits.REASON_RECYCLED, exits.REASON_MEMORY}
    assert set(exits.KILL_REASONS) == set(get_args(vocabulary.KillReason))


def test_a_change_cause_is_a_load_cause_or_peak():
    assert set(get_args(vocabulary.ChangeCause)) == {*get_args(vocabulary.LoadCause), "peak", ""}
    assert vocabulary.CAUSE_PEAK in get_args(vocabulary.ChangeCause)
    assert set(vocabulary.UNLOAD_CAUSES) <= set(get_args(vocabulary.LoadCause))
    assert vocabulary.LOAD_POLICIES == ("eager", "lazy")
