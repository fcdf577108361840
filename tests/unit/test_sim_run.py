"""`mars sim run`: a quick scenario writes its JSON and PNGs; the seed table is labelled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from console.cli import build_parser, main
from orchestrator.scheduling import LinkCostModel
from sim import run as sim_run
from sim.des import SimConfig
from sim.des_events import Failure, poisson_arrivals
from sim.report import Setup
from sim.scenarios import SCENARIOS, seed_table
from sim.scenarios.workload import cpu_gpu_dag, mixed_pool

PNG = b"\x89PNG\r\n\x1a\n"


def test_cli_knows_every_scenario() -> None:
    assert set(sim_run.NAMES) == set(SCENARIOS)
    args = build_parser().parse_args(["sim", "run", "seed-table", "--quick", "--seed", "3"])
    assert (args.scenario, args.quick, args.seed, args.seeds) == ("seed-table", True, 3, None)
    args = build_parser().parse_args(["sim", "run", "failures", "--seeds", "7"])
    assert args.seeds == 7


def test_quick_scenario_writes_json_and_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "ec"
    assert sim_run.main(["edge-cloud", "--quick", "--seeds", "1", "--out", str(out)]) == 0
    doc = json.loads((out / "result.json").read_text())
    assert doc["scenario"] == "edge-cloud"
    assert doc["seeds"] == [1]
    assert set(doc["summary"]) == {
        "portfolio",
        "heft",
        "kube-like",
        "least-loaded",
        "round-robin",
        "weighted-random",
        "earliest-start",
    }
    s = doc["per_seed"]["1"]["portfolio"]
    assert s["completed"] == s["pipelines"] == 30
    assert s["planning_ms"]["p99"] > 0
    assert doc["gantt"]["attempts"]
    for name in ("utilisation.png", "completion_cdf.png", "gantt.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 1000, name


def _tiny_seed_setup(seed: int, quick: bool) -> Setup:
    cluster, links = mixed_pool(10, seed=seed)
    graphs = [cpu_gpu_dag(10, seed=k) for k in range(8)]
    arrivals = poisson_arrivals(graphs, 2.0, seed=seed)
    return Setup(
        cluster=cluster,
        cost=LinkCostModel(links),
        arrivals=arrivals,
        failures=[Failure(arrivals[4].at)],
        config=SimConfig(noise_sigma=0.2, seed=seed),
        util_window=(arrivals[0].at, arrivals[-1].at),
    )


def test_seed_table_prints_ours_beside_the_seeds_labelled_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(seed_table, "build", _tiny_seed_setup)
    seed_table.run(tmp_path, [1, 2], True, False)
    text = capsys.readouterr().out
    assert "SEED REPORTED ours" in text and "SEED REPORTED traditional" in text
    assert "420.0" in text and "8.200" in text and "83.0" in text
    assert "kubernetes-like" in text and "heartbeat 0.5 s x 3 misses" in text
    assert "over 2 seed(s) (1-2)" in text
    # Every variant has a row naming its detection model; the same-detection (heartbeat)
    # rows come first, the Kubernetes-like detection rows after them.
    rows = [line for line in text.splitlines() if "(1-1.5 s)" in line or "(330-345 s)" in line]
    labels = [v.label for v in seed_table.VARIANTS]
    shown = [max((lb for lb in labels if row.startswith(lb + " ")), key=len) for row in rows]
    assert shown == labels
    kinds = ["(1-1.5 s)" in row for row in rows]
    assert kinds == [True] * 5 + [False] * 3
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["seed_reported"]["p99_scheduling_latency_ms"] == {"ours": 89.0, "traditional": 420.0}
    for seed in ("1", "2"):
        ours = doc["per_seed"][seed][seed_table.OURS]
        assert ours["recovery_s"]["count"] == 1
        # Heartbeat detection alone is 1.0-1.5 s; Kubernetes-like eviction alone is >= 330 s.
        assert ours["recovery_s"]["mean"] >= 1.0
        assert doc["per_seed"][seed][seed_table.TRAD]["recovery_s"]["mean"] >= 330.0


def test_without_matplotlib_a_scenario_says_what_to_install_in_one_line_and_writes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `sim` extra is optional: without it the tables and JSON are written as the docs
    say, and one line names what to install (before, a traceback and no result)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    out = tmp_path / "ec"
    assert main(["sim", "run", "edge-cloud", "--quick", "--seeds", "1", "--out", str(out)]) == 0
    assert json.loads((out / "result.json").read_text())["scenario"] == "edge-cloud"
    assert not list(out.glob("*.png"))
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "matplotlib" in line]
    assert len(said) == 1 and 'pip install "mars-orchestrator[sim]"' in said[0], err
    assert "Traceback" not in err
