"""Who may publish and subscribe to what: the permission block of every identity kind.

The nats-server enforces these, so a message's subject is proof of who sent it: every subject
an agent publishes on names that agent (its advert and heartbeat, its task events, the data it
pushes as a producer), and a receiver that checks the name in the subject knows the sender.
Only replicas may offer, commit, cancel or drain on an agent, or write bookings, pipeline
records and results (all of `$KV`); users reach the API on subjects that name them, so a
replica knows whose pipeline it is; nobody but the server publishes `$SYS`.

Object-store buckets have no per-object permissions in NATS: an agent may write chunks into
`MARS_DATA` and `MARS_OUTPUTS` under any name, which is why a consumer checks an object's
sha256 against the transfer notice the producer sent on its own subject.
"""

from __future__ import annotations

from typing import Any

from schemas import subjects

P = subjects.PREFIX
#: The hub's JetStream domain: clients at a leaf reach the hub's JetStream through it.
HUB_DOMAIN = "hub"
#: JetStream's API as a client at the hub and one at a leaf (through the domain) address it.
API_PREFIXES = ("$JS.API", f"$JS.{HUB_DOMAIN}.API")


def _api(*rests: str) -> list[str]:
    return [f"{p}.{r}" for r in rests for p in API_PREFIXES]


#: Read-only use of JetStream: account info, a stream's info.
#: (nats-py's object store read looks its stream up by subject: STREAM.NAMES)
JS_READ = _api("INFO", "STREAM.INFO.*", "STREAM.NAMES")
#: Object stores agents write (outputs crossing sites; outputs kept for `mars get`).
AGENT_WRITES = (subjects.DATA_BUCKET, subjects.OUTPUTS_BUCKET)
#: Object stores agents read (plus the ones they write).
AGENT_READS = (subjects.INPUTS_BUCKET, subjects.ARTIFACTS_BUCKET)
NEVER = ["$SYS.>"]


def inbox(name: str) -> str:
    """The reply-subject prefix of one identity: only it may subscribe under it."""
    return f"_INBOX_{name}"


def _obj_read(bucket: str) -> list[str]:
    s = f"OBJ_{bucket}"
    return [
        *_api(
            f"CONSUMER.CREATE.{s}",
            f"CONSUMER.CREATE.{s}.>",
            f"CONSUMER.DELETE.{s}.*",
            f"CONSUMER.INFO.{s}.*",
            f"DIRECT.GET.{s}.>",
            f"DIRECT.GET.{s}",
            f"STREAM.MSG.GET.{s}",
        ),
        f"$JS.FC.{s}.>",
    ]


def _obj_write(bucket: str) -> list[str]:
    return [f"$O.{bucket}.>", *_api(f"STREAM.PURGE.OBJ_{bucket}")]


def _kv_read(bucket: str) -> list[str]:
    s = f"KV_{bucket}"
    return _api(f"DIRECT.GET.{s}.>", f"DIRECT.GET.{s}", f"STREAM.MSG.GET.{s}")


def agent(agent_id: str) -> dict[str, Any]:
    a = agent_id
    publish = [
        subjects.advert(a),
        subjects.heartbeat(a),
        f"{subjects.EVENTS}.task.*.*.{a}",
        f"{subjects.EVENTS}.input_gone.*.{a}",
        subjects.drift(a),
        f"{P}.agents.*.data.from.{a}",
        f"{P}.agents.*.data.ack.{a}",
        f"{P}.agents.*.cmd.fetch",
        f"{P}.agents.*.cmd.probe",
        *JS_READ,
        *[s for b in (*AGENT_WRITES, *AGENT_READS) for s in _obj_read(b)],
        *[s for b in AGENT_WRITES for s in _obj_write(b)],
        *_kv_read(subjects.ARTIFACT_NAMES_BUCKET),
    ]
    subscribe = [
        f"{P}.agents.{a}.>",
        subjects.DISCOVER,
        subjects.ALL_ADVERTS,  # link probes find their peers
        f"{inbox(a)}.>",
    ]
    return {
        "publish": {"allow": publish, "deny": NEVER},
        "subscribe": {"allow": subscribe},
        # replies to what replicas and peers ask it (offers, commits, fetches, probes)
        "allow_responses": {"max": 1, "expires": "10m"},
    }


def replica(name: str) -> dict[str, Any]:
    """Replicas are the control plane: everything in the account, nothing in `$SYS`."""
    return {"publish": {"allow": [">"], "deny": NEVER}, "subscribe": {"allow": [">"]}}


def _client(name: str, api: list[str], extra: list[str]) -> dict[str, Any]:
    return {
        "publish": {
            "allow": [
                *api,
                *JS_READ,
                *_obj_read(subjects.OUTPUTS_BUCKET),  # mars get
                *_obj_read(subjects.INPUTS_BUCKET),
                *_obj_write(subjects.INPUTS_BUCKET),  # mars submit --input
                *extra,
            ],
            "deny": NEVER,
        },
        "subscribe": {"allow": [f"{inbox(name)}.>"]},
    }


def user(name: str) -> dict[str, Any]:
    """The API on the subjects that name this user (`mars.v1.api.<op>.<user>`) and its own
    pipelines' events; inputs in, outputs out."""
    perms = _client(name, [f"{subjects.API}.*.{name}"], [])
    perms["subscribe"]["allow"].append(f"{P}.users.{name}.>")
    return perms


def admin(name: str) -> dict[str, Any]:
    """The whole API, every pipeline's events, artifacts and their names, service discovery."""
    perms = _client(
        name,
        [f"{subjects.API}.>", "$SRV.>"],
        [
            *_obj_read(subjects.ARTIFACTS_BUCKET),
            *_obj_write(subjects.ARTIFACTS_BUCKET),
            *_kv_read(subjects.ARTIFACT_NAMES_BUCKET),
            f"$KV.{subjects.ARTIFACT_NAMES_BUCKET}.>",
            *_api(f"STREAM.PURGE.KV_{subjects.ARTIFACT_NAMES_BUCKET}"),
        ],
    )
    perms["subscribe"]["allow"].append(f"{subjects.EVENTS}.pipeline.>")
    return perms
