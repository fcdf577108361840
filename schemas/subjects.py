"""Every NATS subject MARS uses, under one versioned prefix."""

from __future__ import annotations

PREFIX = "mars.v1"

API_SERVICE = "mars-api"
API_QUEUE = "mars-orchestrators"
API = f"{PREFIX}.api"
SUBMIT = f"{API}.submit"
STATUS = f"{API}.status"
LIST = f"{API}.list"
CANCEL = f"{API}.cancel"
AGENTS = f"{API}.agents"
API_SUBJECTS = (SUBMIT, STATUS, LIST, CANCEL, AGENTS)

#: Subjects of one orchestrator replica (its owner name: `Ident`), outside the queue group.
REPLICAS = f"{PREFIX}.orch"

ALL_ADVERTS = f"{PREFIX}.agents.*.advert"
ALL_HEARTBEATS = f"{PREFIX}.agents.*.hb"
#: Orchestrators publish here on start so agents advertise at once.
DISCOVER = f"{PREFIX}.discover"

EVENTS = f"{PREFIX}.events"
ALL_TASK_EVENTS = f"{EVENTS}.task.>"
ALL_PIPELINE_EVENTS = f"{EVENTS}.pipeline.>"
EVENTS_STREAM = "MARS_EVENTS"
#: What orchestrators conclude about agents: suspect, dead, partition (`ClusterEvent`).
CLUSTER_EVENTS = f"{EVENTS}.cluster"
#: KV bucket of committed task results, key `<pipeline>.<task>` (`TaskResult`, created once).
RESULTS_BUCKET = "MARS_RESULTS"
#: The server's connect/disconnect advisories, when the account imports them from the system
#: account (the embedded server's does; see docs/recovery.md).
CONN_ADVISORIES = "$SYS.ACCOUNT.*.>"


def advert(agent_id: str) -> str:
    return f"{PREFIX}.agents.{agent_id}.advert"


def heartbeat(agent_id: str) -> str:
    return f"{PREFIX}.agents.{agent_id}.hb"


def offer(agent_id: str) -> str:
    return f"{PREFIX}.agents.{agent_id}.cmd.offer"


def offers(agent_id: str) -> str:
    """Several offers in one request (`OfferBatch` -> `OfferBatchReply`)."""
    return f"{PREFIX}.agents.{agent_id}.cmd.offers"


def commit(agent_id: str) -> str:
    return f"{PREFIX}.agents.{agent_id}.cmd.commit"


def cancel(agent_id: str) -> str:
    return f"{PREFIX}.agents.{agent_id}.cmd.cancel"


def job(agent_id: str) -> str:
    """Ask an agent whether it holds a task's job under a token (`JobQuery` -> `JobReply`)."""
    return f"{PREFIX}.agents.{agent_id}.cmd.job"


def data(agent_id: str) -> str:
    """Where agents of wire level 4 and older take pushed outputs (`data_from` since 5)."""
    return f"{PREFIX}.agents.{agent_id}.data"


def data_from(agent_id: str, producer_agent: str) -> str:
    """Outputs pushed to `agent_id` by `producer_agent` (wire level 5 on): the subject names
    the sender, so the server's permissions let only that agent publish it, and the consumer
    takes only what its producer's committed agent sent."""
    return f"{PREFIX}.agents.{agent_id}.data.from.{producer_agent}"


def all_data_to(agent_id: str) -> str:
    """Every `data_from` subject of `agent_id` (its subscription)."""
    return f"{PREFIX}.agents.{agent_id}.data.from.*"


def data_ack(agent_id: str) -> str:
    """Where a consumer of wire level 4 or older confirms receipt of a fetched output to its
    producer's agent (`data_ack_from` since 5)."""
    return f"{PREFIX}.agents.{agent_id}.data.ack"


def data_ack_from(agent_id: str, consumer_agent: str) -> str:
    """Where `consumer_agent` confirms receipt of a fetched output to its producer's agent
    `agent_id` (wire level 5 on)."""
    return f"{PREFIX}.agents.{agent_id}.data.ack.{consumer_agent}"


def all_data_acks_to(agent_id: str) -> str:
    return f"{PREFIX}.agents.{agent_id}.data.ack.*"


def sender_of(subject: str) -> str | None:
    """The agent a `data_from` or `data_ack_from` subject names as its sender (None: another
    subject, e.g. the older forms without one)."""
    parts = subject.split(".")
    if (
        len(parts) == 7
        and subject.startswith(f"{PREFIX}.agents.")
        and (parts[4:6] == ["data", "from"] or parts[4:6] == ["data", "ack"])
        and parts[3]
        and parts[6]
    ):
        return parts[6]
    return None


def fetch(agent_id: str) -> str:
    """Ask a producer's agent for a retained output (re-placed or late consumers)."""
    return f"{PREFIX}.agents.{agent_id}.cmd.fetch"


#: JetStream object store bucket for outputs above the inline threshold.
DATA_BUCKET = "MARS_DATA"
#: JetStream object store bucket where each task's output is kept for its pipeline's retention
#: (`mars get`), under `<pipeline>/<task>/<token>`.
OUTPUTS_BUCKET = "MARS_OUTPUTS"
#: JetStream object store bucket of pipelines' inputs, each under its sha256.
INPUTS_BUCKET = "MARS_INPUTS"


def probe(agent_id: str) -> str:
    """Link probes: the agent echoes small payloads and acknowledges large ones."""
    return f"{PREFIX}.agents.{agent_id}.cmd.probe"


ALL_DRIFT = f"{EVENTS}.drift.>"


def drift(agent_id: str) -> str:
    """Calibration drift notices of one agent (`CalibrationDrift`)."""
    return f"{EVENTS}.drift.{agent_id}"


def drain(agent_id: str) -> str:
    """Drain an agent (`DrainCommand` -> `DrainReply`)."""
    return f"{PREFIX}.agents.{agent_id}.cmd.drain"


def task_event(pipeline_id: str, task_id: str, agent_id: str) -> str:
    """A task event, named by the agent that publishes it (wire level 5 on): the server's
    permissions let only that agent publish it, and the orchestrator drops one whose
    payload's `agent_id` is another. Agents of level 4 and older leave the agent out."""
    return f"{EVENTS}.task.{pipeline_id}.{task_id}.{agent_id}"


def task_events_of(pipeline_id: str) -> str:
    """Every task event of one pipeline, in either form."""
    return f"{EVENTS}.task.{pipeline_id}.>"


_TASK_EVENT_PREFIX = f"{EVENTS}.task."


def _task_event_parts(subject: str) -> list[str] | None:
    """[pipeline, task] or [pipeline, task, agent] (None: not a task event subject)."""
    if not subject.startswith(_TASK_EVENT_PREFIX):
        return None
    parts = subject[len(_TASK_EVENT_PREFIX) :].split(".")
    return parts if len(parts) in (2, 3) and all(parts) else None


def pipeline_of_task_event(subject: str) -> str | None:
    """The pipeline id a task event's subject names (None: not a task event subject)."""
    parts = _task_event_parts(subject)
    return parts[0] if parts is not None else None


def agent_of_task_event(subject: str) -> str | None:
    """The agent a task event's subject names as its publisher (None: not a task event
    subject, or one in the form of level 4 and older, which names none)."""
    parts = _task_event_parts(subject)
    return parts[2] if parts is not None and len(parts) == 3 else None


ALL_EVICTIONS = f"{EVENTS}.evict.>"


def eviction(pipeline_id: str) -> str:
    return f"{EVENTS}.evict.{pipeline_id}"


def pipeline_event(pipeline_id: str) -> str:
    return f"{EVENTS}.pipeline.{pipeline_id}"


ALL_INPUTS_GONE = f"{EVENTS}.input_gone.>"


def input_gone(pipeline_id: str, agent_id: str) -> str:
    """A consumer's input no longer held by its producer's agent (`InputGone`), published by
    the consumer's agent `agent_id` (wire level 5 on; level 4 and older leave it out)."""
    return f"{EVENTS}.input_gone.{pipeline_id}.{agent_id}"


_INPUT_GONE_PREFIX = f"{EVENTS}.input_gone."


def input_gone_parts(subject: str) -> tuple[str, str | None] | None:
    """(pipeline, publishing agent) an `input_gone` subject names (the agent None in the
    older form without it); None: not an `input_gone` subject."""
    if not subject.startswith(_INPUT_GONE_PREFIX):
        return None
    parts = subject[len(_INPUT_GONE_PREFIX) :].split(".")
    if not all(parts):
        return None
    if len(parts) == 1:
        return parts[0], None
    if len(parts) == 2:
        return parts[0], parts[1]
    return None


def replica_cancel(owner: str) -> str:
    """A `CancelRequest` passed on to the replica holding the pipeline's lease, by the one the
    queue group gave it to (or by a replica that cancelled it and then lost its lease)."""
    return f"{REPLICAS}.{owner}.cancel"


#: Every replica's hello (`ReplicaHello`), heard by all of them.
REPLICA_HELLO = f"{REPLICAS}.hello"


def replica_list(owner: str) -> str:
    """A `ListRequest` for the pipelines one replica holds in memory (no others)."""
    return f"{REPLICAS}.{owner}.list"


def replica_status(owner: str) -> str:
    """A `StatusRequest` passed on to the replica holding a pipeline that has no record yet
    (just placed, or waiting for an agent), by a replica that cannot answer from the record."""
    return f"{REPLICAS}.{owner}.status"


#: JetStream object store of artifacts (ONNX models, Python bundles), one object per content,
#: named by its sha256 (schemas/artifacts.py).
ARTIFACTS_BUCKET = "MARS_ARTIFACTS"
#: KV bucket of the names given to artifacts: key `artifact_key(name, sha256)` -> `ArtifactInfo`.
ARTIFACT_NAMES_BUCKET = "MARS_ARTIFACT_NAMES"


def artifact_key(name: str, sha256: str) -> str:
    """The names bucket's key of one name given to one artifact's bytes."""
    return f"{name}.{sha256}"


def api_as(subject: str, user: str) -> str:
    """One of API_SUBJECTS as user `user` asks it (`<subject>.<user>`). The server lets a user
    publish only on its own (the deploy's permissions), and a replica answers there only
    about that user's pipelines; the unsuffixed subjects are the admin's (every pipeline)."""
    return f"{subject}.{user}"


def api_users(subject: str) -> str:
    """Every user's form of one of API_SUBJECTS (what the replicas serve)."""
    return f"{subject}.*"


def api_user(subject: str) -> str | None:
    """The user token a per-user API subject ends in, unchecked (orchestrator/api/users.py
    checks it); None for an unsuffixed one."""
    for base in API_SUBJECTS:
        if subject.startswith(base + ".") and len(subject) > len(base) + 1:
            return subject[len(base) + 1 :]
    return None


def user_pipeline_event(user: str, pipeline_id: str) -> str:
    """A pipeline's events again, for the user who submitted it: in the secure deployment a
    user may subscribe only under `mars.v1.users.<user>.>`, never to every pipeline's."""
    return f"{PREFIX}.users.{user}.pipeline.{pipeline_id}"
