"""One open-files budget for a gateway's HTTP connections, gRPC connections and shared-memory regions."""
from __future__ import annotations

import logging
import resource

import pytest

from ringserve.gateway import descriptors
from ringserve.gateway.descriptors import FDS_PER_REGION, RESERVED_FDS, DescriptorBudget, fit_open_files

DEFAULTS = DescriptorBudget(http_connections=4096, grpc_connections=1024, shm_regions=512)


@pytest.fixture
def nofile():
    """RLIMIT_NOFILE as it was, put back after the test."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield before
    resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_the_budget_counts_every_connection_two_files_per_region_and_the_reserve():
    assert DEFAULTS.descriptors() == 4096 + 1024 + FDS_PER_REGION * 512 + RESERVED_FDS


def test_the_soft_open_files_limit_is_raised_so_that_every_cap_fits(nofile):
    """A shell's usual soft limit is 1024, under the defaults: the connections past it would meet EMFILE
    at accept() (the client's connection closed unanswered) instead of their protocol's refusal."""
    soft, hard = nofile
    wanted = DescriptorBudget(1024, 256, 64)
    if hard != resource.RLIM_INFINITY and hard < wanted.descriptors():
        pytest.skip(f"the hard open-files limit here ({hard}) is under {wanted.descriptors()}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))

    assert fit_open_files(wanted) == wanted

    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (wanted.descriptors(), hard)  # as far as needed, no further


def test_a_soft_limit_that_already_fits_is_left_alone(nofile):
    soft, hard = nofile
    small = DescriptorBudget(8, 8, 0)
    assert fit_open_files(small) == small
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)


class FakeLimits:
    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.limits, self.refuse, self.set = (soft, hard), refuse, []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        self.set.append(limits)
        if self.refuse:
            raise ValueError("not allowed")
        self.limits = limits


@pytest.mark.parametrize("refuse", [False, True], ids=["hard-limit-low", "raise-refused"])
def test_when_the_caps_cannot_fit_each_is_cut_by_one_factor_and_the_log_says_how_to_serve_more(
        monkeypatch, caplog, refuse):
    limits = FakeLimits(1024, 2048, refuse)
    monkeypatch.setattr(descriptors.resource, "getrlimit", limits.getrlimit)
    monkeypatch.setattr(descriptors.resource, "setrlimit", limits.setrlimit)

    with caplog.at_level(logging.WARNING, "ringserve.gateway"):
        fits = fit_open_files(DEFAULTS)

    assert limits.set == [(2048, 2048)]  # up to the hard limit
    served_fds = 1024 if refuse else 2048
    assert fits.descriptors() <= served_fds  # past these, each kind's refusal rather than EMFILE
    factor = (served_fds - RESERVED_FDS) / (DEFAULTS.descriptors() - RESERVED_FDS)
    assert fits == DescriptorBudget(int(4096 * factor), int(1024 * factor), int(512 * factor))
    assert (f"the open-files limit ({served_fds}, hard 2048) does not fit --max-connections 4096, "
            f"--grpc-max-connections 1024 and 512 shared-memory regions") in caplog.text
    assert f"serving {fits.http_connections} HTTP connections" in caplog.text
    assert "raise the limit (ulimit -n, systemd's LimitNOFILE=)" in caplog.text


def test_a_limit_under_the_reserve_still_serves_one_of_each_wanted_and_no_grpc_when_it_is_off():
    assert DescriptorBudget(4096, 0, 512).scaled(100) == DescriptorBudget(1, 0, 1)
