"""`mars orchestrator --keep-hours`: how long pipelines' keys stay in JetStream after their
last write, checked when parsed."""

from __future__ import annotations

import pytest

from orchestrator.cli import build_parser


def test_keep_hours_defaults_to_a_day_and_takes_hours() -> None:
    p = build_parser()
    assert p.parse_args(["orchestrator"]).keep_hours == 24.0
    assert p.parse_args(["orchestrator", "--keep-hours", "2.5"]).keep_hours == 2.5


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "1e9", "a day"])
def test_keep_hours_out_of_range_or_not_a_number_is_refused(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["orchestrator", "--keep-hours", bad])
    assert exit_.value.code == 2
    assert "--keep-hours" in capsys.readouterr().err
