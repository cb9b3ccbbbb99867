"""The SM share a lease's green contexts may use (virtualize.server._guard_green), from its MPS percentage."""

from __future__ import annotations

import pytest

from virtualize.server._guard_green import SHARE_ENV, share_percent, share_sms


def test_a_share_is_whole_coscheduled_groups_of_the_gpus_sms():
    """Half of an H100's 132 SMs in groups of 8 is 64 SMs (not 66, which no partition can hold); a share
    too small for the smallest partition gets that partition; a whole GPU keeps every SM."""
    assert share_sms(132, 8, 8, 50) == 64
    assert share_sms(132, 8, 8, 1) == 8
    assert share_sms(132, 8, 8, 100) == 132
    assert share_sms(4, 1, 1, 50) == 2


@pytest.mark.parametrize(
    ("value", "percent"), [(None, 100), ("25", 25), ("0", 1), ("250", 100), ("half", 100)]
)
def test_the_share_comes_from_the_workers_mps_percentage(monkeypatch, value, percent):
    """No percentage is the whole GPU; one out of range is clamped to 1..100; an unreadable one is the
    whole GPU (MPS itself still holds the lease to its threads)."""
    if value is None:
        monkeypatch.delenv(SHARE_ENV, raising=False)
    else:
        monkeypatch.setenv(SHARE_ENV, value)
    assert share_percent() == percent
