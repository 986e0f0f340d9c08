"""Triton's own sequence-batcher QA (tests/triton_qa/, unchanged) against ringserve: issue 38's proof.

Each case is one unittest method of Triton's L0_sequence_batcher, L0_dyna_sequence_batcher or
L0_implicit_state, run as their test.sh runs it: the repository test.sh builds (from Triton's generators,
tests/support/triton_qa_models.py), the environment test.sh exports, a fresh server per method, and the
client on localhost:8000/8001 (in a network namespace of its own: tests/support/triton_qa_runner.py).

CASES is every case that needs nothing of Triton's internals (no TRITONSERVER_DELAY_SCHEDULER, no custom
C++ backend, no shared memory); DELAY_CASES the ones that need the server to honour
TRITONSERVER_DELAY_SCHEDULER / TRITONSERVER_BACKLOG_DELAY_SCHEDULER as Triton's sequence batcher does.
ENABLED says which run in the suite; RINGSERVE_TRITON_QA=all (every case of CASES), =delay (DELAY_CASES)
or =<method names, case ids or beginnings of them, space-separated> runs others without editing this file, e.g.

    RINGSERVE_TRITON_QA=all .venv/bin/python -m pytest tests/integration/test_triton_sequence_qa.py -m triton_qa
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.netns import NoNamespace
from tests.support.triton_qa_models import (
    DELAY_ENV,
    dyna_sequence_repo,
    implicit_state_repo,
    preserve_ordering_repo,
    sequence_batcher_repo,
)
from tests.support.triton_qa_runner import run_case

pytestmark = [pytest.mark.integration, pytest.mark.triton_qa]

SEQUENCE_MODULE = "L0_sequence_batcher/sequence_batcher_test.py"
DYNA_MODULE = "L0_dyna_sequence_batcher/dyna_sequence_batcher_test.py"
IMPLICIT_MODULE = "L0_implicit_state/implicit_state.py"

# L0_sequence_batcher/test.sh's NO_DELAY_TESTS, run on every model trial (0 1 2 4 v).
NO_DELAY_TESTS = ("test_simple_sequence", "test_length1_sequence", "test_batch_size", "test_no_sequence_start",
                  "test_no_sequence_start2", "test_no_sequence_end", "test_no_correlation_id")
# Its DELAY_TESTS (every trial) and QUEUE_DELAY_TESTS (queue_delay_models).
DELAY_TESTS = ("test_backlog_fill", "test_backlog_fill_no_end", "test_backlog_same_correlation_id",
               "test_backlog_same_correlation_id_no_end", "test_backlog_sequence_timeout", "test_half_batch",
               "test_skip_batch", "test_full_batch", "test_ragged_batch", "test_backlog")
QUEUE_DELAY_TESTS = ("test_queue_delay_no_min_util", "test_queue_delay_half_min_util", "test_queue_delay_full_min_util")
# L0_dyna_sequence_batcher/test.sh: the NO_BATCHING=1 stage, then the batched stage after its sed.
DYNA_NO_BATCHING_TESTS = ("test_simple_sequence", "test_length1_sequence")
DYNA_BATCHED_TESTS = ("test_multi_sequence_different_shape", "test_multi_sequence", "test_multi_parallel_sequence",
                      "test_backlog", "test_backlog_fill", "test_backlog_fill_no_end", "test_backlog_sequence_timeout")
# L0_implicit_state/implicit_state.py: the two of its seven tests that use no custom C++ backend.
IMPLICIT_STATE_TESTS = ("test_request_output_not_allowed", "test_request_output")

TRIALS = ("0", "1", "2", "4", "v")
# IMPLICIT_STATE / INITIAL_STATE_ZERO / INITIAL_STATE_FILE as L0_sequence_batcher runs under
# L0_implicit_state (and plainly).
STATE_VARIANTS = ("plain", "implicit", "implicit,initial_state_zero", "implicit,initial_state_file")


@dataclass(frozen=True)
class Case:
    suite: str  # "sequence", "sequence_delay", "python", "preserve_ordering", "dyna", "implicit_state"
    variant: str  # which repository of that layout ("trial=1,implicit", ...)
    module: str
    test: str  # Class.method, as test.sh passes it
    env: dict[str, str] = field(default_factory=dict, compare=False, hash=False)  # beyond the layout's env

    @property
    def id(self) -> str:
        return f"{self.suite}[{self.variant}]::{self.test}"


def _sequence_cases(tests: tuple[str, ...], trials: tuple[str, ...], suite: str = "sequence",
                    variants: tuple = STATE_VARIANTS) -> list[Case]:
    cases = []
    for trial in trials:
        for variant in variants:
            for test in tests:
                delay = DELAY_ENV.get(test)
                env = {} if delay is None else {"TRITONSERVER_DELAY_SCHEDULER": str(delay[0]),
                                                "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": str(delay[1])}
                cases.append(Case(suite, f"trial={trial},{variant}", SEQUENCE_MODULE, f"SequenceBatcherTest.{test}", env))
    return cases


CASES: list[Case] = [
    *_sequence_cases(NO_DELAY_TESTS, TRIALS),
    *[Case("dyna", f"{state},no_batching", DYNA_MODULE, f"DynaSequenceBatcherTest.{t}")
      for state in ("plain", "implicit") for t in DYNA_NO_BATCHING_TESTS],
    *[Case("dyna", f"{state},batched", DYNA_MODULE, f"DynaSequenceBatcherTest.{t}")
      for state in ("plain", "implicit") for t in DYNA_BATCHED_TESTS],
    *[Case("implicit_state", "onnx", IMPLICIT_MODULE, f"ImplicitStateTest.{t}") for t in IMPLICIT_STATE_TESTS],
    # Python models (the `python` trial, qa/python_models/sequence_int32; and sequence_py): ringserve's Python
    # models with control inputs, correlation_id() and flags(). No implicit state: Triton has none for them.
    *_sequence_cases(NO_DELAY_TESTS, TRIALS, suite="python", variants=("plain",)),
    *[Case("preserve_ordering", "python", SEQUENCE_MODULE, f"SequenceBatcherPreserveOrderingTest.{t}")
      for t in ("test_sequence_with_preserve_ordering", "test_sequence_without_preserve_ordering")],
]
DELAY_CASES: list[Case] = [*_sequence_cases(DELAY_TESTS, TRIALS, suite="sequence_delay"),
                           *_sequence_cases(QUEUE_DELAY_TESTS, ("queue_delay",), suite="sequence_delay")]

# What the suite runs: method names ("test_simple_sequence": every case of it), case ids
# ("dyna[plain,no_batching]::DynaSequenceBatcherTest.test_simple_sequence") or, without "::", beginnings of
# case ids ("sequence[trial=1,plain]": one repository's cases; "python[": a whole suite); a leading "!"
# leaves out what the rest names ("!test_backlog_sequence_timeout").
# The default suite runs one repository of each kind (~32 cases, each a fresh stack, ~6 s a case here): implicit
# state batched, variable dims with the initial-state file, Oldest with its backlog, the implicit-state
# tests, Python models and the ordering of a stream. .ci/run runs every case of CASES apart
# (RINGSERVE_TRITON_QA=all, ~25 min on the 2-core machine): 197 cases, every one passing on 2026-12-07.
ENABLED: tuple[str, ...] = (
    "sequence[trial=1,implicit]",
    "sequence[trial=v,implicit,initial_state_file]",
    "dyna[implicit,batched]",
    "implicit_state[",
    "python[trial=1,plain]",
    "preserve_ordering[",
)


def _matches(case: Case, name: str) -> bool:
    if "::" in name:  # a whole case id
        return case.id == name
    return case.test.split(".")[1] == name or case.id.startswith(name)


def _selected() -> list[Case]:
    wanted = os.environ.get("RINGSERVE_TRITON_QA", "")
    if wanted == "all":
        return CASES
    if wanted == "delay":
        return DELAY_CASES
    names = wanted.split() or ENABLED
    taken = [n for n in names if not n.startswith("!")]
    left_out = [n[1:] for n in names if n.startswith("!")]
    return [c for c in CASES + DELAY_CASES
            if any(_matches(c, n) for n in taken) and not any(_matches(c, n) for n in left_out)]


def _repo(case: Case, work: Path) -> tuple[Path, dict[str, str]]:
    """The case's repository, built once per layout and variant into `work`."""
    work.mkdir(parents=True, exist_ok=True)
    if case.suite in ("sequence", "sequence_delay", "python"):
        parts = dict(p.split("=") if "=" in p else (p, "1") for p in case.variant.split(","))
        initial_state = "zero" if "initial_state_zero" in parts else "file" if "initial_state_file" in parts else None
        return sequence_batcher_repo(work, parts["trial"], implicit="implicit" in parts, initial_state=initial_state,
                                     backends=("python",) if case.suite == "python" else ("onnx",))
    if case.suite == "dyna":
        return dyna_sequence_repo(work, implicit=case.variant.startswith("implicit"),
                                  batched_stage=case.variant.endswith("batched"))
    if case.suite == "implicit_state":
        return implicit_state_repo(work)
    return preserve_ordering_repo(work)


_repos: dict[tuple[str, str], tuple[Path, dict[str, str]]] = {}


_NONE_ENABLED = pytest.param(None, id="none-enabled", marks=pytest.mark.skip(
    reason="no Triton QA case is enabled (ENABLED is empty); RINGSERVE_TRITON_QA=all runs every case"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", _selected() or [_NONE_ENABLED], ids=lambda c: c.id)
def test_triton_s_own_sequence_qa_passes_against_ringserve(case: Case, tmp_path_factory: pytest.TempPathFactory):
    key = (case.suite, case.variant)
    if key not in _repos:
        _repos[key] = _repo(case, tmp_path_factory.mktemp(f"qa-{case.suite}-{case.variant}".replace(",", "-")))
    repo, env = _repos[key]
    try:
        result = run_case(repo, case.module, case.test, {**env, **case.env}, tmp_path_factory.mktemp("qa-run"))
    except NoNamespace as exc:
        pytest.skip(f"Triton's QA needs localhost:8000 and :8001 of its own: {exc}")

    report = (f"{case.id}: stage {result['stage']}, exit {result['returncode']}, results {result['results']}\n"
              f"--- client ---\n{result['output'][-6000:]}\n--- server log ---\n{result['server_log'][-3000:]}")
    print(report)
    assert result["stage"] == "test", report
    assert result["returncode"] == 0 and result["results"] == {"total": 1, "errors": 0, "failures": 0}, report


def test_every_enabled_name_names_a_case():
    assert [name for name in ENABLED if not any(_matches(c, name.removeprefix("!")) for c in CASES + DELAY_CASES)] == []
    assert len({c.id for c in CASES + DELAY_CASES}) == len(CASES + DELAY_CASES)
