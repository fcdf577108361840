"""Measure the corpus with ONNX Runtime on this host: the predictor's training data.

    python -m tools.predictor_profile --corpus out/predictor/corpus \
        --out orchestrator/predictor/data

Each device configuration is a (provider, intra-op threads) pair; on a CPU-only host the
1-thread and 2-thread CPU sessions are two configurations of *one* CPU (the agent runs
1 thread; 2 threads stands in for a wider CPU, and on a shared 2-core host it does not repeat).
The device features recorded for each configuration are what an agent on this host would
advertise (the agent's own calibration), so the model learns against the figures it will be
given.

Timing (`measure_rows`, pure over a clock and callables so its rules are unit-tested):

- every row (model, batch, configuration) is warmed up, then its *call* is sized so that one
  timed call lasts >= `min_call_s` (5 ms): a call wraps `iters` back-to-back `sess.run`s, and
  times are divided by `iters`, so labels stay per `sess.run` at the row's batch;
- `rounds` (4) interleaved rounds: each round visits every row (odd rounds in order, even
  rounds in reverse) for `calls` (3) timed calls, so a slow period hits many rows a little
  rather than one row fully;
- pass A = minimum over the odd rounds, pass B = minimum over the even rounds (the same
  statistic over the same number of calls: their gap is the noise floor, like with like);
  a row whose passes differ by more than `tolerance` (5 %) is re-measured (fresh rounds, up
  to `max_remeasure` times); the label is the minimum over all its timed calls;
- rows are grouped by configuration (so a 1-thread row never follows a 2-thread one inside a
  block: the 2-thread pool's spinning slowed it), and a reference kernel (`cal_matmul`, a
  fixed 512x512 MatMul) heads every configuration's block in the same rounds; its label is
  stored per row (`ref_s`) and in the provenance, so times can be normalised across runs and
  hosts (`label_s / ref_s`).

Before measuring, the profiler waits (bounded) for the 1-minute load average to drop below a
threshold; the load and the CPU share other processes used are recorded in the provenance.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from orchestrator.predictor.corpus import DEFAULT_DIR
from orchestrator.predictor.features import DATA_DIR, GraphFeatures
from schemas.agent import DeviceSpec

MEASUREMENTS = "measurements.csv"
PROVENANCE = "provenance.json"
REFERENCE = "cal_matmul"
GRAPH_COLS = [f.name for f in fields(GraphFeatures)]
COLUMNS = [
    "model", "family", "split", "config", "provider", "threads", "kind", "gflops", "mem_gbps",
    "call_overhead_ms", *GRAPH_COLS, "label_s", "median_s", "pass_a_s", "pass_b_s",
    "first_pass_a_s", "first_pass_b_s", "remeasured", "iters", "runs", "ref_s",
]  # fmt: skip

MIN_CALL_S = 0.005
ROUNDS = 4
CALLS = 3
TOLERANCE = 0.05
MAX_REMEASURE = 2
WARMUP = 3

Clock = Callable[[], float]
K = TypeVar("K", bound=Hashable)


def sized_iterations(
    run: Callable[[], Any],
    min_call_s: float,
    clock: Clock = time.perf_counter,
    max_iters: int = 100_000,
    probes: int = 3,
) -> int:
    """How many back-to-back `run()`s one timed call must wrap to last >= `min_call_s`: sized
    from the fastest of `probes` single runs (with 20 % margin), then re-timed and grown until
    a wrapped call is long enough."""
    one = math.inf
    for _ in range(probes):
        t0 = clock()
        run()
        one = min(one, clock() - t0)
    iters = max(1, min(max_iters, math.ceil(1.2 * min_call_s / max(one, 1e-9))))
    while True:
        t0 = clock()
        for _ in range(iters):
            run()
        took = clock() - t0
        if took >= min_call_s or iters >= max_iters:
            return iters
        grow = math.ceil(iters * 1.2 * min_call_s / max(took, 1e-9))
        iters = min(max_iters, max(iters + 1, grow))


def pair_gap(a: float, b: float) -> float:
    """Relative gap of two passes: |a - b| / min(a, b)."""
    return abs(a - b) / max(min(a, b), 1e-12)


@dataclass
class RowTiming:
    """Per-call seconds of one row: every timed call, by attempt and round."""

    iters: int
    attempts: list[list[list[float]]] = field(default_factory=list)  # [attempt][round][call]

    def passes(self, attempt: int = -1) -> tuple[float, float]:
        """(pass A, pass B) of an attempt: minimum over its odd / even rounds."""
        rounds = self.attempts[attempt]
        a = min(x for r in rounds[0::2] for x in r)
        b = min(x for r in rounds[1::2] for x in r)
        return a, b

    @property
    def label(self) -> float:
        return min(x for att in self.attempts for r in att for x in r)

    @property
    def median(self) -> float:
        return statistics.median(x for att in self.attempts for r in att for x in r)

    @property
    def runs(self) -> int:
        return sum(len(r) for att in self.attempts for r in att)

    @property
    def remeasured(self) -> int:
        return len(self.attempts) - 1


def _interleaved(
    rows: Mapping[K, Callable[[], Any]],
    iters: Mapping[K, int],
    keys: Sequence[K],
    rounds: int,
    calls: int,
    clock: Clock,
) -> dict[K, list[list[float]]]:
    """`rounds` rounds over `keys` (odd rounds in order, even rounds reversed), `calls` timed
    calls per row per round, each wrapping `iters[key]` runs; per-run seconds."""
    out: dict[K, list[list[float]]] = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys if r % 2 == 0 else list(reversed(keys)):
            run, n, got = rows[k], iters[k], []
            for _ in range(calls):
                t0 = clock()
                for _ in range(n):
                    run()
                got.append((clock() - t0) / n)
            out[k].append(got)
    return out


def measure_rows(
    rows: Mapping[K, Callable[[], Any]],
    *,
    rounds: int = ROUNDS,
    calls: int = CALLS,
    min_call_s: float = MIN_CALL_S,
    tolerance: float = TOLERANCE,
    max_remeasure: int = MAX_REMEASURE,
    warmup: int = WARMUP,
    clock: Clock = time.perf_counter,
    log: Callable[[str], None] | None = None,
) -> dict[K, RowTiming]:
    """Time every row by the rules in the module docstring. `rows` maps a key to a callable
    making one `sess.run`; keys keep their order in every odd round."""
    if rounds < 2 or rounds % 2 or rounds * calls < 7:
        raise ValueError("need an even number >= 2 of rounds and >= 7 timed calls in all")
    keys = list(rows)
    for k in keys:
        for _ in range(warmup):
            rows[k]()
    iters = {k: sized_iterations(rows[k], min_call_s, clock) for k in keys}
    out = {k: RowTiming(iters[k]) for k in keys}
    todo = keys
    for attempt in range(max_remeasure + 1):
        got = _interleaved(rows, iters, todo, rounds, calls, clock)
        for k in todo:
            out[k].attempts.append(got[k])
        todo = [k for k in todo if pair_gap(*out[k].passes()) > tolerance]
        if log is not None:
            log(f"attempt {attempt + 1}: {len(got)} rows measured, {len(todo)} over "
                f"{100 * tolerance:.0f}% apart")  # fmt: skip
        if not todo:
            break
    return out


def row_keys(
    models: Sequence[str], threads: Sequence[int], batches: Sequence[int]
) -> list[tuple[str, int, int]]:
    """Rows in measuring order: grouped by configuration (a 2-thread session's pool keeps a
    core busy for a while after its run, which slowed the 1-thread row after it when
    configurations alternated row by row), each block headed by the reference kernel."""
    return [
        key
        for t in threads
        for key in [(REFERENCE, t, 1), *((m, t, b) for m in models for b in batches)]
    ]


def wait_for_idle(threshold: float, poll_s: float, max_wait_s: float) -> float:
    """Block until the 1-minute load average is below `threshold` (or give up); returns it."""
    deadline = time.monotonic() + max_wait_s
    load = os.getloadavg()[0]
    while load >= threshold and time.monotonic() < deadline:
        print(f"load average {load:.2f} >= {threshold}; waiting {poll_s:.0f}s", flush=True)
        time.sleep(poll_s)  # polling the OS load, not synchronising with anything we own
        load = os.getloadavg()[0]
    return load


def calibrated_cpu(threads: Sequence[int]) -> dict[int, DeviceSpec]:
    """This host's CPU as an agent would advertise it (median of 5 calibrations, shared by all
    configurations: the agent's figures do not depend on threads), once per thread count."""
    from edge_agent.calibrate import calibrate_device

    base = DeviceSpec(device_id="cpu", kind="cpu")
    runs = [calibrate_device(base) for _ in range(5)]
    figures: dict[str, Any] = {
        k: statistics.median(float(getattr(r, k)) for r in runs)
        for k in ("gflops", "mem_bandwidth_gbps", "call_overhead_ms")
    }
    return {
        t: base.model_copy(
            update={
                **figures,
                "device_id": f"cpu-t{t}",
                "labels": {"threads": str(t)},
                "calibrated": True,
            }
        )
        for t in threads
    }


def _session(path: Path, provider: str, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=[provider])


def _runner(sess: Any, batch: int | None) -> Callable[[], Any]:
    """One `sess.run` at `batch` (the first dimension; None keeps the input's own shape), as
    the agent calls it."""
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
    if batch is not None:
        shape[0] = batch
    feed = {inp.name: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}
    return lambda: sess.run(None, feed)


class Interference:
    """Share of the machine's CPU time used by *other* processes during a measurement: the
    load average cannot tell (it counts the profiler itself), /proc/stat minus our own CPU
    time can."""

    def __init__(self) -> None:
        import psutil

        self._ps = psutil
        self._me = psutil.Process()
        self._t0 = self._read()

    def _read(self) -> tuple[float, float, float]:
        st = self._ps.cpu_times()
        idle = st.idle + getattr(st, "iowait", 0.0)
        total = sum(st)
        mine = sum(self._me.cpu_times()[:2])
        return total, total - idle, mine

    def share(self) -> float:
        t1 = self._read()
        total = max(t1[0] - self._t0[0], 1e-9)
        return max(0.0, (t1[1] - self._t0[1]) - (t1[2] - self._t0[2])) / total


def host_facts() -> dict[str, Any]:
    import onnxruntime as ort

    from edge_agent.probe import probe_host

    h = probe_host()
    return {
        "host": socket.gethostname(),
        "cpu_model": h.cpu_model,
        "logical_cores": h.logical_cores,
        "physical_cores": h.physical_cores,
        "memory_mb": round(h.memory_mb),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "providers": ort.get_available_providers(),
    }


def profile(
    corpus: Path,
    out: Path,
    *,
    batches: Sequence[int] = (1, 8),
    threads: Sequence[int] = (1, 2),
    rounds: int = ROUNDS,
    calls: int = CALLS,
    min_call_s: float = MIN_CALL_S,
    tolerance: float = TOLERANCE,
    idle_below: float = 0.8,
    idle_poll_s: float = 30.0,
    idle_max_s: float = 1200.0,
    limit: int | None = None,
) -> Path:
    manifest = json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))
    if limit is not None:  # a subset that still spans every family and split
        manifest = [e for e in manifest if e["index"] < limit]
    from edge_agent.executors import BUILTIN_MODELS
    from orchestrator.predictor.features import shipped_book

    book = shipped_book().dump()
    for name, e in book.items():  # built-in models are extra held-out models
        manifest.append({**e, "name": name, "family": "builtin", "split": "test",
                         "file": str(BUILTIN_MODELS / f"{name}.onnx")})  # fmt: skip
    load0 = wait_for_idle(idle_below, idle_poll_s, idle_max_s)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    devices = calibrated_cpu(threads)
    t_start = time.monotonic()
    files = {e["name"]: corpus / e["file"] for e in manifest}
    files[REFERENCE] = corpus / f"{REFERENCE}.onnx"
    sessions = {
        (name, t): _session(path, "CPUExecutionProvider", t) for name, path in files.items()
        for t in threads
    }  # fmt: skip
    rows = {
        (name, t, b): _runner(sessions[(name, t)], None if name == REFERENCE else b)
        for name, t, b in row_keys([e["name"] for e in manifest], threads, batches)
    }
    probe = Interference()
    timed = measure_rows(
        rows, rounds=rounds, calls=calls, min_call_s=min_call_s, tolerance=tolerance,
        log=lambda s: print(f"{s} ({time.monotonic() - t_start:.0f}s)", flush=True),
    )  # fmt: skip
    foreign = probe.share()
    ref = {t: timed[(REFERENCE, t, 1)] for t in threads}
    out.mkdir(parents=True, exist_ok=True)
    with (out / MEASUREMENTS).open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, COLUMNS)
        w.writeheader()
        for e in manifest:
            base, per = GraphFeatures(**e["base"]), GraphFeatures(**e["per_batch"])
            for t in threads:
                d = devices[t]
                for b in batches:
                    rt = timed[(e["name"], t, b)]
                    a, bb = rt.passes()
                    a0, b0 = rt.passes(0)
                    g = base.at_batch(per, b)
                    w.writerow({
                        "model": e["name"], "family": e["family"], "split": e["split"],
                        "config": f"cpu-ort-t{t}", "provider": "CPUExecutionProvider",
                        "threads": t, "kind": "cpu", "gflops": f"{d.gflops:.4g}",
                        "mem_gbps": f"{d.mem_bandwidth_gbps:.4g}",
                        "call_overhead_ms": f"{d.call_overhead_ms:.4g}",
                        **{k: f"{v:.6g}" for k, v in g.as_dict().items()},
                        "label_s": f"{rt.label:.6g}", "median_s": f"{rt.median:.6g}",
                        "pass_a_s": f"{a:.6g}", "pass_b_s": f"{bb:.6g}",
                        "first_pass_a_s": f"{a0:.6g}", "first_pass_b_s": f"{b0:.6g}",
                        "remeasured": rt.remeasured, "iters": rt.iters, "runs": rt.runs,
                        "ref_s": f"{ref[t].label:.6g}",
                    })  # fmt: skip
    prov = {
        **host_facts(),
        "started_utc": started,
        "finished_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t_start, 1),
        "loadavg_1m_at_start": round(load0, 2),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "foreign_cpu_share": round(foreign, 3),
        "idle_threshold": idle_below,
        "models": len(manifest),
        "subset": None if limit is None else f"corpus models with index < {limit}, per family",
        "batches": list(batches),
        "configs": {
            f"cpu-ort-t{t}": {
                "provider": "CPUExecutionProvider",
                "intra_op_threads": t,
                "gflops": devices[t].gflops,
                "mem_bandwidth_gbps": devices[t].mem_bandwidth_gbps,
                "call_overhead_ms": devices[t].call_overhead_ms,
                "calibration": "edge_agent.calibrate.calibrate_device, median of 5 (shared)",
                "reference_s": ref[t].label,
                "reference_passes_s": list(ref[t].passes()),
            }
            for t in threads
        },
        "reference_kernel": f"{REFERENCE}: MatMul of a 512x512 input by a 512x512 weight "
        "(float32, 268 MFLOP), heading each configuration's block in every round; "
        "label_s / ref_s normalises across runs",
        "timing": f"{WARMUP} warm-up runs; a timed call wraps `iters` sess.run calls so it lasts "
        f">= {1e3 * min_call_s:g} ms (times are per sess.run); {rounds} interleaved rounds "
        f"(odd in order, even reversed; rows grouped by configuration) of {calls} calls per "
        "row; pass A = min over odd rounds, "
        "pass B = min over even rounds; label_s = min over all timed calls, median_s = their "
        "median",
        "remeasure_rule": f"a row whose passes differ by more than {100 * tolerance:g}% is "
        f"re-measured in fresh interleaved rounds, up to {MAX_REMEASURE} times; pass_a_s / "
        "pass_b_s are the last attempt's, first_pass_* the first attempt's",
        "remeasured_rows": sum(1 for rt in timed.values() if rt.remeasured),
    }
    (out / PROVENANCE).write_text(json.dumps(prov, indent=1) + "\n", encoding="utf-8")
    return out / MEASUREMENTS


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Profile the ONNX corpus on this host.")
    p.add_argument("--corpus", type=Path, default=DEFAULT_DIR)
    p.add_argument("--out", type=Path, default=DATA_DIR)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--calls", type=int, default=CALLS, help="timed calls per row per round")
    p.add_argument("--min-call-ms", type=float, default=1e3 * MIN_CALL_S)
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    p.add_argument("--idle-below", type=float, default=0.8)
    p.add_argument("--idle-max-s", type=float, default=1200.0)
    p.add_argument("--limit", type=int, default=None,
                   help="only corpus models with index < N in each family")  # fmt: skip
    args = p.parse_args(argv)
    path = profile(
        args.corpus, args.out, batches=args.batches, threads=args.threads, rounds=args.rounds,
        calls=args.calls, min_call_s=args.min_call_ms / 1e3, tolerance=args.tolerance,
        idle_below=args.idle_below, idle_max_s=args.idle_max_s, limit=args.limit,
    )  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
