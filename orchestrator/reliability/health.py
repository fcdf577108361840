"""Agent liveness as a pure state machine: alive -> suspect -> dead, and the partition rule.

The NATS server is the primary signal: a disconnect advisory (the agent's connection closed:
a crash, or the server's pings unanswered on a silent link or by a hung process, see
`schemas.presence`) makes an agent dead at once. Heartbeats are the backstop, for what the
server cannot tell (agents sharing one connection, a server whose advisories do not reach
us): they arrive every `interval` (each agent advertises its own, sparse by default); one
missed heartbeat (half an interval late) makes an agent *suspect* (nothing is moved yet),
`misses` intervals of silence make it *dead*. Any heartbeat or advert is proof of life.

Recovery acts on `Recover` effects. When many agents are in trouble at once (more than
`flood_fraction` of the fleet, and at least `flood_min` of them), the likelier story is a
partition (or this orchestrator's own link or clock stalling), not that many devices died
together: recovery of further deaths is *held* rather than stampeding work onto the rest. The
hold ends when every held agent is back; when some came back and the rest stayed silent for one
more detection window after the last return (those are then recovered); or after
`partition_timeout_s`. A new incarnation of an agent is proof its previous one is gone, so its
recovery is never held.

Synchronous and I/O-free: the shell (`reliability.recovery`) feeds it adverts, heartbeats,
advisories and clock ticks, and performs the returned effects.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Literal

from schemas.presence import PING_INTERVAL_S

Liveness = Literal["alive", "suspect", "dead"]
DEFAULT_MISSES = 3
DEFAULT_FLOOD_FRACTION = 0.3
DEFAULT_FLOOD_MIN = 3
DEFAULT_PARTITION_TIMEOUT_S = 30.0
WAVE_INTERVALS = 2.0
#: Deaths the server reports (a connection closed) that one event causes come within this of
#: each other: a partition's silent connections are closed one ping timer at a time.
DEFAULT_DISCONNECT_SPREAD_S = PING_INTERVAL_S
#: Causes of death reported by the server, as they happen (not by missed heartbeats).
PROMPT_CAUSES = frozenset({"disconnect", "silent"})
#: Dead members are forgotten after this long (they rejoin as new members if they return).
FORGET_DEAD_S = 600.0
#: A heartbeat counts as missed once it is half an interval late (beats drift by milliseconds;
#: suspicion should not flap with them).
SUSPECT_AFTER = 1.5


@dataclass(frozen=True)
class Transition:
    """An agent changed liveness (published as a cluster event)."""

    agent_id: str
    incarnation: str
    old: Liveness
    new: Liveness
    cause: str
    at: float


@dataclass(frozen=True)
class Recover:
    """Act on a death now: release the agent's bookings and re-place its work."""

    agent_id: str
    incarnation: str
    cause: str
    #: When it was declared dead, and when it was last heard from.
    at: float
    last_seen: float


@dataclass(frozen=True)
class Partition:
    """A flood of losses began (`started`) or ended: re-placement paused or resumed."""

    started: bool
    agents: tuple[str, ...]
    cause: str
    at: float


Effect = Transition | Recover | Partition


@dataclass
class Member:
    agent_id: str
    incarnation: str
    interval_s: float
    last_seen: float
    state: Liveness = "alive"
    died_at: float | None = None
    #: The deadline its one live entry in the tracker's queue stands for (inf: none).
    queued: float = math.inf


@dataclass
class Hold:
    started: float
    #: Deaths whose recovery waits for the partition to end, by agent id.
    held: dict[str, Recover] = field(default_factory=dict)
    #: When the last held agent came back (the partition is healing), and the detection
    #: window after which those still silent are taken as really dead.
    returned: float | None = None
    window_s: float = 0.0


class HealthTracker:
    def __init__(
        self,
        misses: int = DEFAULT_MISSES,
        *,
        flood_fraction: float = DEFAULT_FLOOD_FRACTION,
        flood_min: int = DEFAULT_FLOOD_MIN,
        partition_timeout_s: float = DEFAULT_PARTITION_TIMEOUT_S,
        disconnect_spread_s: float = DEFAULT_DISCONNECT_SPREAD_S,
    ) -> None:
        if misses < 1:
            raise ValueError("misses must be >= 1")
        self.misses = misses
        self.flood_fraction = flood_fraction
        self.flood_min = flood_min
        self.partition_timeout_s = partition_timeout_s
        self.disconnect_spread_s = disconnect_spread_s
        self.members: dict[str, Member] = {}
        self.hold: Hold | None = None
        #: Deaths in the current wave (agent -> instant), for the flood rule.
        self._wave: dict[str, float] = {}
        #: No verdicts while the observer itself is cut off, nor until this instant after it
        #: reconnects: silence it could not hear through says nothing about the agents.
        self.blind = False
        self.grace_until = -math.inf
        #: (deadline, agent, incarnation): every member not dead has one live entry here, at
        #: or before its next deadline (heartbeats only move deadlines later, so a beat need
        #: not touch it); a tick and `next_check` look at what is due, not at every member.
        self._queue: list[tuple[float, str, str]] = []
        #: (died at, agent, incarnation) of dead members, to forget after FORGET_DEAD_S.
        self._dead: list[tuple[float, str, str]] = []

    # -- queries --------------------------------------------------------------------------------
    def state(self, agent_id: str) -> Liveness | None:
        m = self.members.get(agent_id)
        return None if m is None else m.state

    def is_dead(self, agent_id: str) -> bool:
        return self.state(agent_id) == "dead"

    @property
    def partitioned(self) -> bool:
        return self.hold is not None

    def next_check(self) -> float:
        """The earliest instant a tick could change something (inf when nothing is due)."""
        if self.blind:
            return math.inf
        due = math.inf
        q = self._queue
        while q:
            m = self._live(q[0])
            if m is None:
                heapq.heappop(q)
                continue
            at = self._deadline(m)
            if at == q[0][0]:
                due = at
                break
            m.queued = at  # it beat since: its entry moves to its real deadline
            heapq.heapreplace(q, (at, m.agent_id, m.incarnation))
        if self.hold is not None:
            due = min(due, self.hold.started + self.partition_timeout_s)
            if self.hold.returned is not None:
                due = min(due, self.hold.returned + self.hold.window_s)
        return max(due, self.grace_until)

    # -- the observer's own connection ----------------------------------------------------------
    def observer_lost(self) -> None:
        """The orchestrator lost NATS: it hears nobody, so it judges nobody."""
        self.blind = True

    def observer_back(self, now: float, grace_s: float) -> None:
        """Reconnected: every agent not already dead starts a fresh window, and none is judged
        before `now + grace_s` (agents reconnect on their own jittered backoff) nor dies
        before a whole window of silence from now (a sparse heartbeat may be most of one
        interval away)."""
        self.blind = False
        self.grace_until = now + grace_s
        for m in self.members.values():
            if m.state != "dead":
                fresh = now + max(0.0, grace_s - m.interval_s * self.misses)
                m.last_seen = max(m.last_seen, fresh)
                m.state = "alive"
                self._enqueue(m)

    # -- inputs ---------------------------------------------------------------------------------
    def join(self, agent_id: str, incarnation: str, interval_s: float, now: float) -> list[Effect]:
        """An advert: a new agent, a new incarnation (the old one is dead), or a known one."""
        m = self.members.get(agent_id)
        if m is not None and m.incarnation == incarnation:
            changed, m.interval_s = m.interval_s != interval_s, interval_s
            beat = self.beat(agent_id, incarnation, now)
            if changed and m.state != "dead":  # its deadline may be sooner now
                self._enqueue(m)
            return beat
        out: list[Effect] = []
        if m is not None:
            if m.state != "dead":
                out += self._die(m, "new_incarnation", now, never_hold=True)
            elif self.hold is not None and agent_id in self.hold.held:
                out.append(self.hold.held.pop(agent_id))  # proven gone: recover now
            self._wave.pop(agent_id, None)
        self.members[agent_id] = new = Member(agent_id, incarnation, interval_s, now)
        self._enqueue(new)
        out += self._maybe_end_hold(now, "heartbeats_returned")
        return out

    def beat(self, agent_id: str, incarnation: str, now: float) -> list[Effect]:
        """A heartbeat (or advert) of the current incarnation; others are ignored here."""
        m = self.members.get(agent_id)
        if m is None or m.incarnation != incarnation:
            return []
        m.last_seen = max(m.last_seen, now)
        if m.state == "alive":
            return []
        old, m.state, m.died_at = m.state, "alive", None
        self._enqueue(m)
        cause = "rejoined" if old == "dead" else "heartbeat"
        out: list[Effect] = [Transition(agent_id, incarnation, old, "alive", cause, now)]
        self._wave.pop(agent_id, None)
        if self.hold is not None and self.hold.held.pop(agent_id, None) is not None:
            # came back before anything was moved: the partition is healing
            self.hold.returned = now
            self.hold.window_s = max(self.hold.window_s, m.interval_s * self.misses)
        out += self._maybe_end_hold(now, "heartbeats_returned")
        return out

    def disconnected(
        self, agent_id: str, incarnation: str | None, now: float, cause: str = "disconnect"
    ) -> list[Effect]:
        """The server closed the agent's connection (`cause`: "disconnect", or "silent" when it
        stopped answering the server's pings): dead at once (no reconnect raced it)."""
        m = self.members.get(agent_id)
        if m is None or m.state == "dead":
            return []
        if incarnation is not None and incarnation != m.incarnation:
            return []
        return self._die(m, cause, now)

    def tick(self, now: float) -> list[Effect]:
        if self.blind or now < self.grace_until:
            return []
        out: list[Effect] = []
        due: dict[str, Member] = {}
        while self._queue and self._queue[0][0] <= now:
            m = self._live(heapq.heappop(self._queue))
            if m is not None:
                m.queued = math.inf
                due[m.agent_id] = m
        ordered = sorted(due.values(), key=lambda m: m.last_seen)
        # suspicion first: a tick that finds many silent at once must see them all as troubled
        for m in ordered:
            if m.state == "alive" and now - m.last_seen > self._suspect_after(m):
                m.state = "suspect"
                out.append(
                    Transition(m.agent_id, m.incarnation, "alive", "suspect", "heartbeat", now)
                )
        for m in ordered:
            if m.state == "suspect" and now - m.last_seen > m.interval_s * self.misses:
                out += self._die(m, "heartbeat", now)
        for m in ordered:
            if m.state != "dead":
                self._enqueue(m)
        while self._dead and now - self._dead[0][0] > FORGET_DEAD_S:
            died, agent_id, incarnation = heapq.heappop(self._dead)
            m = self.members.get(agent_id)
            if m is not None and m.incarnation == incarnation and m.died_at == died:
                self.forget(agent_id)
        hold = self.hold
        if hold is not None and now >= hold.started + self.partition_timeout_s:
            out += self._end_hold(now, "partition_timeout")
        elif (
            hold is not None and hold.returned is not None and now >= hold.returned + hold.window_s
        ):
            out += self._end_hold(now, "heartbeats_returned")  # healing stopped: the rest are dead
        return out

    def forget(self, agent_id: str) -> None:
        """Stop tracking an agent (it left for good)."""
        self.members.pop(agent_id, None)
        self._wave.pop(agent_id, None)
        if self.hold is not None:
            self.hold.held.pop(agent_id, None)

    # -- rules ----------------------------------------------------------------------------------
    def _suspect_after(self, m: Member) -> float:
        return min(SUSPECT_AFTER, self.misses) * m.interval_s

    def _deadline(self, m: Member) -> float:
        """When a tick could next change `m` (inf: dead)."""
        if m.state == "alive":
            return m.last_seen + self._suspect_after(m)
        if m.state == "suspect":
            return m.last_seen + m.interval_s * self.misses
        return math.inf

    def _enqueue(self, m: Member) -> None:
        """Queue `m` at its deadline; an entry it had stops counting."""
        m.queued = self._deadline(m)
        if m.queued < math.inf:
            heapq.heappush(self._queue, (m.queued, m.agent_id, m.incarnation))

    def _live(self, entry: tuple[float, str, str]) -> Member | None:
        """The member a queue entry stands for, if the entry still counts."""
        at, agent_id, incarnation = entry
        m = self.members.get(agent_id)
        if m is None or m.incarnation != incarnation or m.queued != at:
            return None
        return m

    def _troubled(self) -> list[str]:
        """Agents now suspect, or dead in the current wave of losses."""
        out = {a for a, m in self.members.items() if m.state == "suspect"}
        out.update(a for a in self._wave if self.state(a) == "dead")
        return sorted(out)

    def _fleet(self) -> int:
        """The fleet the wave hit: agents not dead, plus those the wave killed."""
        return sum(1 for m in self.members.values() if m.state != "dead") + sum(
            1 for a in self._wave if self.state(a) == "dead"
        )

    def _flooded(self) -> bool:
        troubled = len(self._troubled())
        return troubled >= self.flood_min and troubled > self.flood_fraction * self._fleet()

    def _die(self, m: Member, cause: str, now: float, *, never_hold: bool = False) -> list[Effect]:
        old = m.state
        m.state, m.died_at, m.queued = "dead", now, math.inf
        heapq.heappush(self._dead, (now, m.agent_id, m.incarnation))
        out: list[Effect] = [Transition(m.agent_id, m.incarnation, old, "dead", cause, now)]
        rec = Recover(m.agent_id, m.incarnation, cause, now, m.last_seen)
        if never_hold:
            out.append(rec)
            return out
        # a wave: deaths less than two intervals apart (all of them while held). The agents cut
        # off by one partition fall silent together, so when the first is declared dead the
        # rest are already suspect; unrelated failures seconds apart are not a flood. Deaths
        # the server reports come as they happen: their interval is its spread, not the
        # (sparse) heartbeat's.
        if self.hold is None:
            spread = self.disconnect_spread_s if cause in PROMPT_CAUSES else m.interval_s
            window = WAVE_INTERVALS * spread
            self._wave = {
                a: t for a, t in self._wave.items() if now - t <= window and self.state(a) == "dead"
            }
        self._wave[m.agent_id] = now
        if self.hold is None and self._flooded():
            self.hold = Hold(now)
            out.append(Partition(True, tuple(self._troubled()), cause, now))
        if self.hold is not None:
            self.hold.held[m.agent_id] = rec
        else:
            out.append(rec)
        return out

    def _maybe_end_hold(self, now: float, cause: str) -> list[Effect]:
        """End the hold once every held agent is back (the rest wait for the window)."""
        if self.hold is None or any(self.state(a) == "dead" for a in self.hold.held):
            return []
        return self._end_hold(now, cause)

    def _end_hold(self, now: float, cause: str) -> list[Effect]:
        assert self.hold is not None
        held = [r for a, r in sorted(self.hold.held.items()) if self.state(a) == "dead"]
        self.hold = None
        self._wave = {}
        out: list[Effect] = [Partition(False, tuple(r.agent_id for r in held), cause, now)]
        out += held
        return out
