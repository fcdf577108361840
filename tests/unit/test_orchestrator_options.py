"""`mars orchestrator`'s options that size what it keeps, checked when parsed:
`--keep-hours` (how long pipelines' keys stay in JetStream after their last write) and
`--booking-key-max-kib` (how big a device's booking key may grow)."""

from __future__ import annotations

import pytest

from console.cli import build_parser
from orchestrator.reservations.store import KEY_MAX_BYTES


def test_keep_hours_defaults_to_a_day_and_takes_hours() -> None:
    p = build_parser()
    assert p.parse_args(["orchestrator"]).keep_hours == 24.0
    assert p.parse_args(["orchestrator", "--keep-hours", "2.5"]).keep_hours == 2.5


def test_booking_key_max_defaults_to_the_stores_limit_and_takes_kib() -> None:
    p = build_parser()
    assert p.parse_args(["orchestrator"]).booking_key_max_kib * 1024 == KEY_MAX_BYTES
    assert p.parse_args(["orchestrator", "--booking-key-max-kib", "64"]).booking_key_max_kib == 64


@pytest.mark.parametrize(
    ("option", "bad"),
    [("--keep-hours", v) for v in ("0", "-1", "nan", "1e9", "a day")]
    + [("--booking-key-max-kib", v) for v in ("0", "15", "65537", "1.5", "big")],
)
def test_out_of_range_or_not_a_number_is_refused(
    option: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["orchestrator", option, bad])
    assert exit_.value.code == 2
    assert option in capsys.readouterr().err
