"""Online correction: per (task signature, device) what reported durations say.

Pure and synchronous (the KV persistence is a thin shell in `history.py`). History first:

* warm runs (a session already made; `cold` not said counts as warm) are kept, the last
  WARM_WINDOW of them; once a track has HISTORY_MIN, its estimate is their robust centre
  (`robust_centre`: the lower quartile of those within MAD_K * max(1.4826 * MAD,
  HISTORY_FLOOR) of the median, in log terms), whatever the model said. MAX_STREAK warm
  runs in a row beyond that bound on one side mean the task changed speed: the history
  restarts from them;
* cold runs (a session created for the run: slower, and reported with the model's load
  apart) never enter it: their run time and load are averaged apart (`cold_s`, `load_s`);
* before HISTORY_MIN warm runs, the model's prediction times a factor stands. The factor
  learns from warm runs only, on the log ratio r = ln(actual / base prediction): the first
  observations are averaged exactly (alpha = 1/n), later ones enter an EWMA with alpha =
  ALPHA_MIN; from MIN_FOR_MAD accepted reports on, r is an outlier when |r - median|
  exceeds MAD_K * max(1.4826 * MAD, MAD_FLOOR) over the last WINDOW accepted ratios;
  outliers are not applied, but MAX_STREAK outliers in a row that agree with each other
  mean the task really changed speed, and restart the factor from them.

Runs that shared their agent (`shared`: the most other jobs it ran at the same time, > 0)
say little of the task's own time: they enter neither the warm history nor the factor. Per
track their ratio to the uncontended estimate then (the history's centre, else the model's
prediction times the factor) is kept apart, the last CONTENDED_WINDOW of them and how many
there were; `Track.contention` is their median. A run that does not say (`shared` None: an
agent of an older release) counts as unshared.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

ALPHA_MIN = 0.3
WINDOW = 16
MIN_FOR_MAD = 3
MAD_K = 3.5
MAD_FLOOR = 0.05
MAX_STREAK = 3
#: Warm runs kept per track, and how many make the history the estimate.
WARM_WINDOW = 16
HISTORY_MIN = 3
#: The least spread (log terms, ~5 %) the history's outlier bound assumes: runs within
#: MAD_K times this (~19 %) of the median are never rejected.
HISTORY_FLOOR = 0.05
#: Contended runs' ratios kept per track.
CONTENDED_WINDOW = 16
#: Factors are kept within [1/100, 100]: beyond that the task is not the one we predicted.
MAX_LOG = math.log(100.0)


@dataclass(slots=True)
class Track:
    """One (task signature, device) correction. Slots and tuples of floats: an orchestrator
    holds tens of thousands of these, and a full garbage collection visits every tracked
    object (a tuple of floats is untracked, a list never; an instance dict would be one
    more)."""

    log_factor: float = 0.0
    n: int = 0
    recent: tuple[float, ...] = ()
    pending: tuple[float, ...] = ()
    rejected: int = 0
    updated: float = 0.0
    #: The last warm run times (seconds), and their robust centre once there are
    #: HISTORY_MIN (0.0 before).
    warm: tuple[float, ...] = ()
    warm_s: float = 0.0
    #: Cold runs, apart: how many, and the average of their run times and loads (seconds).
    cold_n: int = 0
    cold_s: float = 0.0
    load_s: float = 0.0
    #: Runs that shared their agent, apart: the last ratios of their run time to the
    #: uncontended estimate then, and how many there were in all.
    contended: tuple[float, ...] = ()
    contended_n: int = 0

    def __post_init__(self) -> None:
        self.recent, self.pending = tuple(self.recent), tuple(self.pending)
        self.warm, self.contended = tuple(self.warm), tuple(self.contended)
        if len(self.warm) >= HISTORY_MIN and self.warm_s <= 0.0:
            self.warm_s = robust_centre(self.warm)

    @property
    def factor(self) -> float:
        return math.exp(self.log_factor)

    @property
    def level(self) -> float:
        """What the track says, in log terms: its warm history's centre once it has one,
        else its factor (what a change of is worth writing down)."""
        return math.log(self.warm_s) if self.warm_s > 0.0 else self.log_factor

    @property
    def contention(self) -> float | None:
        """How much slower than uncontended its runs that shared their agent were: the
        median of their ratios (None before any)."""
        return statistics.median(self.contended) if self.contended else None

    def seconds(self, base_s: float) -> float:
        """The estimate of a warm run: the history's centre, else `base_s` times the factor."""
        return self.warm_s if self.warm_s > 0.0 else base_s * self.factor

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "recent": list(self.recent),
            "pending": list(self.pending),
            "warm": list(self.warm),
            "contended": list(self.contended),
        }


def _spread(logs: Sequence[float], floor: float) -> tuple[float, float]:
    """The median of `logs` and the MAD rule's bound around it."""
    med = statistics.median(logs)
    mad = statistics.median(abs(x - med) for x in logs)
    return med, MAD_K * max(1.4826 * mad, floor)


def robust_centre(runs: Sequence[float]) -> float:
    """The lower quartile of the runs within the MAD rule's bound of their median (in log
    terms). Not their median: what else runs on a host (other processes; MARS's own jobs are
    kept apart) only ever slows a run down, so the low part of a task's runs is its own time,
    the figure its label (a minimum over calls) measures; under load the median of five runs
    sat 8-16 % above it. The quartile still leans on several runs, not the one fastest."""
    logs = [math.log(x) for x in runs]
    med, bound = _spread(logs, HISTORY_FLOOR)
    kept = [x for x, lx in zip(runs, logs, strict=True) if abs(lx - med) <= bound]
    if len(kept) < 2:
        return kept[0]
    return statistics.quantiles(kept, n=4, method="inclusive")[0]


def add_warm(t: Track, actual_s: float) -> None:
    """One warm run into the history (see the module doc)."""
    w = (*t.warm, actual_s)[-WARM_WINDOW:]
    old, new = w[:-MAX_STREAK], w[-MAX_STREAK:]
    if len(old) >= HISTORY_MIN:
        med, bound = _spread([math.log(x) for x in old], HISTORY_FLOOR)
        off = [math.log(x) - med for x in new]
        if all(d > bound for d in off) or all(d < -bound for d in off):
            w = new  # the task changed speed: what came before says nothing of it now
    t.warm = w
    t.warm_s = robust_centre(w) if len(w) >= HISTORY_MIN else 0.0


def _mean_into(mean: float, n: int, x: float) -> float:
    """An average over the first observations, an EWMA after (as the factor's)."""
    return mean + max(1.0 / n, ALPHA_MIN) * (x - mean)


def is_outlier(recent: Sequence[float], r: float) -> bool:
    """The MAD rule over the accepted window."""
    if len(recent) < MIN_FOR_MAD:
        return False
    med = statistics.median(recent)
    mad = statistics.median(abs(x - med) for x in recent)
    return abs(r - med) > MAD_K * max(1.4826 * mad, MAD_FLOOR)


def update(t: Track, r: float, now: float = 0.0) -> bool:
    """Apply one log ratio to a track; True if it was accepted."""
    if not math.isfinite(r):
        return False
    r = max(-MAX_LOG, min(MAX_LOG, r))
    t.updated = now
    if is_outlier(t.recent, r):
        t.rejected += 1
        t.pending = (*t.pending, r)[-MAX_STREAK:]
        if len(t.pending) >= MAX_STREAK and not is_outlier(t.pending, t.pending[-1]):
            # a consistent shift, not noise: start over from the new regime
            t.recent, t.n = t.pending, len(t.pending)
            t.log_factor = statistics.fmean(t.pending)
            t.pending = ()
            return True
        return False
    t.pending = ()
    t.n += 1
    alpha = max(1.0 / t.n, ALPHA_MIN)
    t.log_factor += alpha * (r - t.log_factor)
    t.recent = (*t.recent, r)[-WINDOW:]
    return True


#: Tracks kept, the least recently observed dropped first (one at a time, in O(1)). One is
#: made for each distinct task signature and device observed (~20,000 in a minute of random
#: synthetic tasks), and every full garbage collection of the orchestrator visits each one.
MAX_TRACKS = 8192


class Corrections:
    """All tracks, keyed by (task signature, device key)."""

    def __init__(self, max_tracks: int = MAX_TRACKS) -> None:
        if max_tracks < 1:
            raise ValueError(f"max_tracks must be >= 1, got {max_tracks}")
        self.max_tracks = max_tracks
        #: Least recently observed first: the one to drop is at the front, found in O(1).
        self._tracks: OrderedDict[tuple[str, str], Track] = OrderedDict()
        self._by_sig: dict[str, dict[str, Track]] = {}
        #: Bumped on every change, so callers can cache corrected figures.
        self.version = 0

    def __len__(self) -> int:
        return len(self._tracks)

    def __iter__(self) -> Iterator[tuple[tuple[str, str], Track]]:
        return iter(self._tracks.items())

    def get(self, sig: str, device: str) -> Track | None:
        return self._tracks.get((sig, device))

    def for_signature(self, sig: str) -> dict[str, Track]:
        return self._by_sig.get(sig, {})

    def factor(self, sig: str, device: str) -> float:
        t = self._tracks.get((sig, device))
        return t.factor if t is not None else 1.0

    def observe(
        self,
        sig: str,
        device: str,
        base_s: float,
        actual_s: float,
        now: float,
        *,
        cold: bool | None = None,
        load_s: float | None = None,
        shared: int | None = None,
    ) -> bool:
        """One reported duration against the uncorrected prediction it replaces; `cold`: its
        session was created for it (None: not said, taken as warm), `load_s`: that took;
        `shared`: the most other jobs its agent ran alongside it (None: not said, taken as
        0). True if the track took it in (a warm run the factor rejects still enters the
        history, whose own rule judges it)."""
        if base_s <= 0.0 or actual_s <= 0.0 or not math.isfinite(actual_s):
            return False
        t = self._tracks.get((sig, device))
        if t is None:
            t = self.put(sig, device, Track())
        else:
            self._tracks.move_to_end((sig, device))
        self.version += 1
        if cold:
            t.updated = now
            t.cold_n += 1
            t.cold_s = _mean_into(t.cold_s, t.cold_n, actual_s)
            if load_s is not None and math.isfinite(load_s) and load_s >= 0.0:
                t.load_s = _mean_into(t.load_s, t.cold_n, load_s)
            return True
        if shared:
            t.updated = now
            t.contended_n += 1
            ratio = actual_s / t.seconds(base_s)
            t.contended = (*t.contended, max(1e-6, min(1e6, ratio)))[-CONTENDED_WINDOW:]
            return True
        add_warm(t, actual_s)
        return update(t, math.log(actual_s / base_s), now)

    def put(self, sig: str, device: str, track: Track) -> Track:
        """Hold `track` as the most recent one; past the bound the least recently observed
        is dropped (never this one)."""
        key = (sig, device)
        self._tracks[key] = track
        self._tracks.move_to_end(key)
        self._by_sig.setdefault(sig, {})[device] = track
        self.version += 1
        while len(self._tracks) > self.max_tracks:
            (old_sig, old_device), _ = self._tracks.popitem(last=False)
            per = self._by_sig[old_sig]
            del per[old_device]
            if not per:
                del self._by_sig[old_sig]
        return track

    def load(self, tracks: Iterable[tuple[str, str, Track]]) -> list[tuple[str, str, Track]]:
        """Tracks read back from storage, put oldest update first so that the bound keeps
        the most recently updated; returns those held."""
        ordered = sorted(tracks, key=lambda x: x[2].updated)
        for sig, device, track in ordered:
            self.put(sig, device, track)
        return [(s, d, t) for s, d, t in ordered if self._tracks.get((s, d)) is t]
