"""`mars orchestrator --booking-key-max-kib`, and the device of a booking key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cli import build_parser
from orchestrator.reservations.store import (
    KEY_MAX_BYTES,
    device_key,
    device_key_of,
    device_of_key,
)

IDENT = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
    min_size=1,
    max_size=40,
)


@given(IDENT, IDENT)
def test_a_keys_device_is_the_device_it_was_made_for(agent: str, dev: str) -> None:
    key = device_key(agent, dev)
    assert device_of_key(key) == f"{agent}:{dev}"
    assert device_key_of(device_of_key(key)) == key


def test_the_option_defaults_to_the_stores_limit_and_takes_kib() -> None:
    p = build_parser()
    assert p.parse_args(["orchestrator"]).booking_key_max_kib * 1024 == KEY_MAX_BYTES
    assert p.parse_args(["orchestrator", "--booking-key-max-kib", "64"]).booking_key_max_kib == 64


@pytest.mark.parametrize("bad", ["0", "15", "65537", "1.5", "big"])
def test_out_of_range_or_not_whole_kib_is_refused(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["orchestrator", "--booking-key-max-kib", bad])
    assert exit_.value.code == 2
    assert "--booking-key-max-kib" in capsys.readouterr().err
