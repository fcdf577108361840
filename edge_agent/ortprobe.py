"""ONNX Runtime facts (providers, per-call overhead of the reference model), read in a child
process unless ONNX Runtime is already loaded.

Why a child: importing onnxruntime and opening a session costs an agent ~30 MB of resident
memory for good, and an idle agent should stay small; it imports onnxruntime itself only when it
runs its first ONNX task. This module imports nothing heavy so the child starts quickly.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("mars.agent.ortprobe")

REFERENCE_MODEL = Path(__file__).resolve().parent / "models" / "tiny_cnn.onnx"
CHILD_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class OrtFacts:
    providers: list[str] = field(default_factory=list)
    #: Median ms per reference-model call, per provider measured.
    call_overhead_ms: dict[str, float] = field(default_factory=dict)


def onnx_call_overhead_ms(
    provider: str = "CPUExecutionProvider", calls: int = 30, model: Path = REFERENCE_MODEL
) -> float:
    """Median wall time of one call of the reference model (batch 1) with `provider`: the fixed
    cost every ONNX task pays. 0.0 when ONNX Runtime or the provider is not usable."""
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return 0.0
    try:
        if provider not in ort.get_available_providers():
            return 0.0
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1  # as the executor runs it
        opts.log_severity_level = 3
        sess = ort.InferenceSession(str(model), opts, providers=[provider])
        inp = sess.get_inputs()[0]
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        feed = {inp.name: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}
        for _ in range(3):
            sess.run(None, feed)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3
    except Exception as exc:  # a broken runtime must not stop the agent from starting
        log.warning("ONNX call-overhead benchmark (%s) failed: %s", provider, exc)
        return 0.0


def local_facts(measure: list[str]) -> OrtFacts:
    """Providers of the installed ONNX Runtime and the overhead of each provider in `measure`
    (in this process)."""
    try:
        import onnxruntime as ort

        providers = [str(p) for p in ort.get_available_providers()]
    except Exception:  # absent, or a broken install: no providers
        return OrtFacts()
    overhead = {p: onnx_call_overhead_ms(p) for p in measure if p in providers}
    return OrtFacts(providers, overhead)


def parse_facts(text: str) -> OrtFacts:
    """The child's JSON line; anything malformed reads as "nothing found"."""
    try:
        raw = json.loads(text.strip().splitlines()[-1])
        providers = [str(p)[:256] for p in raw.get("providers", [])][:64]
        overhead = {
            str(k)[:256]: float(v)
            for k, v in dict(raw.get("call_overhead_ms", {})).items()
            if isinstance(v, int | float) and 0.0 <= v < 1e6
        }
        return OrtFacts(providers, overhead)
    except (ValueError, IndexError, TypeError, AttributeError):
        return OrtFacts()


_providers: list[str] | None = None


def _remember(facts: OrtFacts) -> OrtFacts:
    global _providers
    _providers = list(facts.providers)
    return facts


def ort_facts_later(measure: list[str]) -> Callable[[], OrtFacts]:
    """Start reading `local_facts` (in a child process unless onnxruntime is already loaded
    here) and return the function that waits for them, so the caller can benchmark meanwhile.
    The provider list is remembered: agents started in one process without calibration (sim,
    tests) ask once."""
    if not measure and _providers is not None:
        cached = OrtFacts(list(_providers))
        return lambda: cached
    if "onnxruntime" in sys.modules:
        return functools.cache(lambda: _remember(local_facts(measure)))
    cmd = [sys.executable, "-m", "edge_agent.ortprobe", *(f"--measure={p}" for p in measure)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    except OSError as exc:
        log.warning("onnxruntime probe failed to start: %s", exc)
        return OrtFacts

    @functools.cache
    def result() -> OrtFacts:
        try:
            out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            log.warning("onnxruntime probe timed out")
            return OrtFacts()
        if proc.returncode != 0:
            log.warning("onnxruntime probe exited %s: %s", proc.returncode, err[-300:])
            return OrtFacts()
        return _remember(parse_facts(out))

    return result


def ort_facts(measure: list[str]) -> OrtFacts:
    return ort_facts_later(measure)()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--measure", action="append", default=[], help="provider to time")
    facts = local_facts(ap.parse_args().measure)
    print(json.dumps({"providers": facts.providers, "call_overhead_ms": facts.call_overhead_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
