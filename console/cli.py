"""`mars`: run agents and orchestrators, submit pipelines, and try it all with `mars demo`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.metadata
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from orchestrator.infra import eventloop
from schemas.api import PipelineState
from schemas.wire import WIRE_LEVEL
from sim.run import add_arguments as add_sim_run_arguments
from transport import connect

if TYPE_CHECKING:
    from schemas.api import AgentSummary

DEFAULT_URL = os.environ.get("MARS_NATS_URL", "nats://127.0.0.1:4222")


def _run_until_signal(
    main: Callable[[asyncio.Event, asyncio.Event], Awaitable[int | None]],
) -> int:
    """Run a service until SIGINT/SIGTERM: `main(stop, started)` sets `started` once the
    service is up, and from then on stops it gracefully when `stop` is set. Told to stop
    before that (still reaching its server, say), it is cancelled at once: nothing runs yet
    that a graceful stop would wait for."""

    async def runner() -> int:
        stop, started = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: int) -> None:
            if stop.is_set():  # asked again while stopping: the operator will not wait
                print(f"signal {sig} again: exiting now", file=sys.stderr, flush=True)
                os._exit(128 + sig)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, on_signal, sig)
        work = asyncio.ensure_future(main(stop, started))
        told = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((work, told), return_when=asyncio.FIRST_COMPLETED)
        finally:
            told.cancel()
        if not work.done() and not started.is_set():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return 0
        return await work or 0

    return eventloop.run(runner())


async def _reached(url: str, stop: asyncio.Event, retry: bool) -> int | None:
    """The NATS server reached before a service starts (`orchestrator/infra/reach.py`); else the
    exit code: 2 when it is out of reach, 0 when told to stop while trying again."""
    from orchestrator.infra.reach import Unreachable, reach

    try:
        return None if await reach(url, stop, retry=retry) else 0
    except Unreachable as exc:
        print(f"error: {exc} (--retry-connect: keep trying)", file=sys.stderr, flush=True)
        return 2


async def _paced_gc_once_up(started: asyncio.Event) -> None:
    """An agent process, once up: its garbage collector paced (`eventloop.PacedGc`, as the
    orchestrator's; an agent calls any moment idle), and its collections' pauses logged on
    `mars.timing` (debug) when that logger is on (MARS_DEBUG=mars.timing). Runs until
    cancelled."""
    await started.wait()
    timing = logging.getLogger("mars.timing")
    hook = eventloop.gc_pause_hook(timing) if timing.isEnabledFor(logging.DEBUG) else None
    if hook is not None:
        gc.callbacks.append(hook)
    pacer = eventloop.PacedGc()
    try:
        await pacer.run()
    finally:  # the collector back on (its first collection is long) once nothing logs it
        if hook is not None and hook in gc.callbacks:
            gc.callbacks.remove(hook)
        pacer.stop()


def cmd_deploy(args: argparse.Namespace) -> int:
    from console.deploy.command import run

    return run(args)


def cmd_agent(args: argparse.Namespace) -> int:
    from edge_agent.config import AgentConfig, load_config
    from edge_agent.service import run_agent

    config = load_config(args.config) if args.config else AgentConfig()
    updates: dict[str, Any] = {}
    if args.site:
        updates["site"] = args.site
    if args.tier:
        updates["tier"] = args.tier
    if updates:
        config = AgentConfig.model_validate({**config.model_dump(), **updates})

    async def main(stop: asyncio.Event, started: asyncio.Event) -> int | None:
        if (failed := await _reached(args.nats, stop, args.retry_connect)) is not None:
            return failed
        paced = asyncio.create_task(_paced_gc_once_up(started))
        try:
            # SIGTERM/SIGINT: drain, let running work finish for the grace period, cancel the rest
            await run_agent(
                args.nats, config, agent_id=args.id, stop=stop, grace_s=args.grace,
                started=started,
            )  # fmt: skip
        finally:
            paced.cancel()
        return 0

    return _run_until_signal(main)


def cmd_drain(args: argparse.Namespace) -> int:
    """Ask one agent to drain (or to resume) and print what it still holds."""
    import nats

    from schemas import subjects
    from schemas.placement import DrainCommand, DrainReply
    from transport.rpc import nats_error_logger, request

    async def go() -> int:
        cmd = DrainCommand(agent_id=args.agent_id, deadline_s=args.deadline, resume=args.resume)
        nc = await nats.connect(
            connect.servers(args.nats), name="mars-cli", connect_timeout=5,
            allow_reconnect=False, error_cb=nats_error_logger(logging.getLogger("mars.cli")),
            **connect.options(),
        )  # fmt: skip
        try:
            rep = await request(
                nc, subjects.drain(args.agent_id), cmd, DrainReply, timeout=args.timeout
            )
        finally:
            await nc.close()
        state = "draining" if rep.draining else "accepting offers"
        print(f"agent {rep.agent_id}: {state}; {rep.running} running, {rep.queued} queued")
        return 0

    try:
        return eventloop.run(go())
    except Exception as exc:
        who = f"agent {args.agent_id}"
        return _fail(exc, (
            f"no agent {args.agent_id} at {args.nats}: no agent with that id answered "
            "(`mars agents` lists them)",
            f"{who} did not answer within {args.timeout:g} s",
        ))  # fmt: skip


def _keep_hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hours: {text!r}") from None
    if not 0.01 <= hours <= 24 * 365:  # 36 s (a live pipeline's keys are rewritten at a third)
        raise argparse.ArgumentTypeError("--keep-hours must be between 0.01 and 8760")
    return hours


def _page_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= n <= 1000:
        raise argparse.ArgumentTypeError("--limit must be between 1 and 1000")
    return n


def _user(text: str) -> str:
    """`--user`: a token of the API's subjects (schemas/subjects.py `api_as`)."""
    if re.fullmatch(r"[A-Za-z0-9_-]{1,128}", text) is None:
        raise argparse.ArgumentTypeError(f"user {text!r}: 1-128 of A-Z a-z 0-9 _ -")
    return text


def _offset(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= n <= 1 << 31:
        raise argparse.ArgumentTypeError("--offset must be 0 or more")
    return n


def _kib(text: str) -> int:
    try:
        kib = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of KiB: {text!r}") from None
    if not 16 <= kib <= 64 * 1024:
        raise argparse.ArgumentTypeError("--booking-key-max-kib must be between 16 and 65536")
    return kib


def cmd_orchestrator(args: argparse.Namespace) -> int:
    from orchestrator.service import run_orchestrator

    budget = args.plan_budget_ms / 1e3
    keep = args.keep_hours * 3600.0
    key_max = args.booking_key_max_kib * 1024

    async def main(stop: asyncio.Event, started: asyncio.Event) -> int | None:
        if (failed := await _reached(args.nats, stop, args.retry_connect)) is not None:
            return failed
        await run_orchestrator(
            args.nats, stop=stop, plan_budget_s=budget, keep_s=keep,
            booking_key_max_bytes=key_max, started=started, retry_start=args.retry_connect,
        )  # fmt: skip
        return 0

    return _run_until_signal(main)


async def _with_client(
    url: str, fn: Callable[[Any], Awaitable[int]], user: str | None = None
) -> int:
    from transport.client import Client

    client = await Client.connect(url, user=user)
    try:
        return await fn(client)
    finally:
        await client.close()


def _api_silent(url: str) -> tuple[str, str]:
    """What it means when an API request goes unanswered, or unanswered in time."""
    return (
        f"no orchestrator replica answered at {url}: is `mars orchestrator` running there?",
        f"no orchestrator replica answered in time at {url}",
    )


def _fail(exc: Exception, silent: tuple[str, str] = ("", "")) -> int:
    """An error said in words (exit code 2): a refusal with its code and details, a request
    nobody answered or none answered in time (`silent`: what each means for the request),
    a server out of reach. Output cut off by a closed pipe is left to `main`."""
    import nats.errors

    from schemas.codec import DecodeError, RemoteError

    if isinstance(exc, BrokenPipeError):
        raise exc
    nobody, late = silent
    if isinstance(exc, nats.errors.NoRespondersError) and nobody:
        print(f"error: {nobody}", file=sys.stderr)
        return 2
    if isinstance(exc, TimeoutError) and late:  # nats-py's timeout is a TimeoutError too
        print(f"error: {late}", file=sys.stderr)
        return 2
    if isinstance(exc, nats.errors.NoServersError | ConnectionRefusedError):
        print(f"error: cannot reach the NATS server: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, RemoteError):
        env = exc.envelope
        print(f"error {env.code}: {env.message}", file=sys.stderr)
        for k, v in list(env.details.items())[:20]:
            print(f"  {k}: {v}", file=sys.stderr)
        return 2
    if isinstance(exc, DecodeError):
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        for k, v in list(exc.details.items())[:20]:
            print(f"  {k}: {v}", file=sys.stderr)
        return 2
    print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 2


def cmd_submit(args: argparse.Namespace) -> int:
    from console.pipeline_files import load_pipeline
    from console.report import plan_line, plan_table, timeline_table

    async def go(client: Any) -> int:
        given = await _store_inputs(client, args.input) if args.input else []
        spec = load_pipeline(args.file, given)
        reply = await client.submit(spec, pipeline_id=args.id)
        if args.json and not args.wait:
            print(reply.model_dump_json(indent=2))
            return 0
        print(
            f"pipeline {reply.pipeline_id}: {reply.state} "
            f"({plan_line(reply.algorithm, reply.makespan_s, reply.cost)})"
        )
        print(plan_table(reply))
        if not args.wait:
            return 0
        try:
            st = await client.wait(reply.pipeline_id, args.timeout)
        except TimeoutError:
            return await _still_running(client, reply.pipeline_id, args.timeout)
        if args.json:
            print(st.model_dump_json(indent=2))
        else:
            print(timeline_table(st))
            print(f"{st.state}{': ' + st.reason if st.reason else ''}")
        return 0 if st.state == "succeeded" else 1

    try:
        return eventloop.run(_with_client(args.nats, go, args.user))
    except Exception as exc:
        return _fail(exc, _api_silent(args.nats))


async def _store_inputs(client: Any, given: list[str]) -> list[Any]:
    """`--input NAME=PATH`: each file stored once in the inputs bucket, under its digest;
    returns how the spec is to name them."""
    from console import inputs

    described = []
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"error: --input takes NAME=PATH, not {item!r}")
        p = Path(path)
        try:
            d = await asyncio.to_thread(inputs.describe, name, p)
        except OSError as exc:
            raise SystemExit(f"error: --input {name}: {exc}") from None
        sent = await inputs.put(connect.jetstream(client.nc), d, p)
        how = "stored" if sent else "stored before"
        print(f"input {name}: {d.size} B sha256 {d.sha256} ({how})", file=sys.stderr)
        described.append(d)
    return described


#: `mars submit --wait`: the pipeline had not ended when `--timeout` passed.
STILL_RUNNING = 3


async def _still_running(client: Any, pipeline_id: str, waited: float) -> int:
    """`submit --wait` gave up waiting: the pipeline runs on, and how to follow it."""
    from schemas.api import TERMINAL_STATES

    state = "running"
    with contextlib.suppress(Exception):  # its state now, if an orchestrator says it in time
        state = (await client.status(pipeline_id)).state
    if state in TERMINAL_STATES:  # it ended as the wait gave up
        print(state)
        return 0 if state == "succeeded" else 1
    print(
        f"pipeline {pipeline_id}: still {state} after {waited:g} s (--timeout); it keeps "
        f"running: follow it with `mars status {pipeline_id}`, stop it with "
        f"`mars cancel {pipeline_id}`",
        file=sys.stderr,
    )
    return STILL_RUNNING


def cmd_status(args: argparse.Namespace) -> int:
    from console.report import plan_line, timeline_table

    async def go(client: Any) -> int:
        st = await client.status(args.pipeline_id)
        if args.json:
            print(st.model_dump_json(indent=2))
            return 0
        print(f"{st.pipeline_id} {st.name}: {st.state} {st.reason}")
        if st.plan:
            print(f"plan: {plan_line(st.algorithm, st.planned_makespan_s, st.planned_cost)}")
        print(timeline_table(st))
        return 0

    try:
        return eventloop.run(_with_client(args.nats, go, args.user))
    except Exception as exc:
        return _fail(exc, _api_silent(args.nats))


def cmd_get(args: argparse.Namespace) -> int:
    """A task's output into a file (`-o -`: stdout), from the outputs bucket."""
    from console.fetch import FetchError, fetch, find

    task, _, member = args.task.partition(":")

    async def go(client: Any) -> int:
        ts = find(await client.status(args.pipeline_id), task)
        n = await fetch(connect.jetstream(client.nc), ts, args.output, member or None)
        if args.output != "-":
            print(
                f"{args.output}: {n} B of {args.pipeline_id}/{args.task} "
                f"({ts.output_type or 'bytes'}, sha256 {ts.output_sha256})",
                file=sys.stderr,
            )
        return 0

    try:
        return eventloop.run(_with_client(args.nats, go, args.user))
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        return _fail(exc, _api_silent(args.nats))


def cmd_list(args: argparse.Namespace) -> int:
    async def go(client: Any) -> int:
        reply = await client.list(state=args.state, limit=args.limit, offset=args.offset)
        if args.json:
            print(reply.model_dump_json(indent=2))
        for p in [] if args.json else reply.pipelines:
            print(f"{p.pipeline_id}  {p.name:<24} {p.state:<14} {p.tasks:>4} tasks  {p.owner}")
        if reply.unanswered:  # what they know beyond their records is missing above
            print(f"not answered by: {', '.join(reply.unanswered)}", file=sys.stderr)
        shown = args.offset + len(reply.pipelines)
        if shown < reply.total:
            print(
                f"{args.offset + 1}-{shown} of {reply.total}; the next: --offset {shown}",
                file=sys.stderr,
            )
        return 0

    try:
        return eventloop.run(_with_client(args.nats, go, args.user))
    except Exception as exc:
        return _fail(exc, _api_silent(args.nats))


def agent_line(a: AgentSummary) -> str:
    """One agent of `mars agents`: alive, draining (heard from, taking no new work) or
    silent (not heard from lately, or dead: how long since it was), its devices, and the
    windows booked on each (`FULL`: the device's booking key is at its size limit and takes
    no new bookings)."""
    booked = ",".join(
        f"{q.device_id}:{q.windows}" + (f"(FULL, {q.key_bytes // 1024} KiB)" if q.full else "")
        for q in a.queues
        if q.windows or q.full
    )
    older = 0 < a.wire < WIRE_LEVEL  # still to upgrade (docs/operations.md, "Upgrading")
    state = "alive" if a.alive else "draining" if a.draining else "silent"
    return (
        f"{a.agent_id:<16} {state:<8} site={a.site} "
        f"tier={a.tier} running={a.running} devices={','.join(a.devices)}"
        + (f" booked={booked}" if booked else "")
        + (f" wire={a.wire} (an older release)" if older else "")
        + (f" last_seen={a.last_seen_s:.1f}s ago" if state == "silent" else "")
    )


def cmd_agents(args: argparse.Namespace) -> int:
    async def go(client: Any) -> int:
        for a in (await client.agents()).agents:
            print(agent_line(a))
        return 0

    try:
        return eventloop.run(_with_client(args.nats, go, args.user))
    except Exception as exc:
        return _fail(exc, _api_silent(args.nats))


def cmd_bookings(args: argparse.Namespace) -> int:
    import time

    from console.report import bookings_table
    from orchestrator.reservations.listing import read_bookings

    async def go(client: Any) -> int:  # the bucket itself, over the client's connection
        keys = await read_bookings(connect.jetstream(client.nc), args.device, args.pipeline)
        if args.json:
            print(json.dumps([k.as_json() for k in keys], indent=2))
        else:
            print(bookings_table(keys, time.time()))
        return 0

    try:
        return eventloop.run(_with_client(args.nats, go))
    except Exception as exc:
        return _fail(exc, (
            f"JetStream did not answer at {args.nats}: is it enabled on that server?",
            f"JetStream did not answer in time at {args.nats}",
        ))  # fmt: skip


def cmd_artifact(args: argparse.Namespace) -> int:
    """`mars artifact put|ls|rm`: straight to the artifact buckets (console/artifacts.py)."""
    import nats

    from console import artifacts
    from transport.rpc import nats_error_logger

    async def go() -> int:
        nc = await nats.connect(
            connect.servers(args.nats), name="mars-cli", connect_timeout=5,
            allow_reconnect=False, error_cb=nats_error_logger(logging.getLogger("mars.cli")),
            **connect.options(),
        )  # fmt: skip
        try:
            js = connect.jetstream(nc)
            if args.artifact_cmd == "put":
                info, sent = await artifacts.put(
                    js, Path(args.file), name=args.name, kind=args.kind
                )  # fmt: skip
                if args.json:
                    print(info.model_dump_json(indent=2))
                else:
                    print(info.ref)
                    if not sent:
                        print("(the store held these bytes already)", file=sys.stderr)
            elif args.artifact_cmd == "ls":
                listed = await artifacts.listing(js)
                if args.json:
                    rows = [{**x.info.model_dump(mode="json"), "stored": x.stored} for x in listed]
                    print(json.dumps(rows, indent=2))
                else:
                    print(artifacts.table(listed))
            else:
                for info in await artifacts.remove(js, args.target):
                    print(f"removed {info.ref}")
        finally:
            await nc.close()
        return 0

    try:
        return eventloop.run(go())
    except artifacts.ArtifactsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        return _fail(exc, (
            f"JetStream did not answer at {args.nats}: is it enabled on that server?",
            f"JetStream did not answer in time at {args.nats}",
        ))  # fmt: skip


def cmd_cancel(args: argparse.Namespace) -> int:
    async def go(client: Any) -> int:
        rep = await client.cancel(args.pipeline_id, args.reason)
        print(f"{rep.pipeline_id}: {rep.state}")
        return 0

    try:
        return eventloop.run(_with_client(args.nats, go, args.user))
    except Exception as exc:
        return _fail(exc, _api_silent(args.nats))


def cmd_schema(args: argparse.Namespace) -> int:
    from schemas import PUBLIC_MODELS

    schemas = {m.__name__: m.model_json_schema() for m in PUBLIC_MODELS}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, sch in schemas.items():
            (out / f"{name}.schema.json").write_text(json.dumps(sch, indent=2) + "\n")
        print(f"wrote {len(schemas)} schemas to {out}")
    else:
        print(json.dumps(schemas, indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from console.demo import run_demo

    return run_demo(Path(args.pipeline) if args.pipeline else None, args.timeout, args.verbose)


def cmd_sim_agents(args: argparse.Namespace) -> int:
    from sim.fleet import run_fleet

    if args.count < 1 or args.slots < 1 or args.site_count < 1 or not args.gflops > 0:
        print(
            "error: --count, --slots, --site-count and --gflops must be positive", file=sys.stderr
        )
        return 2
    if not 0 < args.heartbeat <= 60:
        print("error: --heartbeat must be in (0, 60] seconds", file=sys.stderr)
        return 2

    async def main(stop: asyncio.Event, started: asyncio.Event) -> None:
        async def announce() -> None:
            await started.wait()
            print(
                f"sim fleet: {args.count} agents with emulated devices on {args.nats} "
                "(SIGINT/SIGTERM stops them)",
                file=sys.stderr,
                flush=True,
            )

        note = asyncio.create_task(announce())
        paced = asyncio.create_task(_paced_gc_once_up(started))
        try:
            await run_fleet(
                args.nats,
                args.count,
                prefix=args.prefix,
                slots=args.slots,
                gflops=args.gflops,
                site_count=args.site_count,
                heartbeat_s=args.heartbeat,
                shared_connection=args.shared_connection,
                state_dir=args.state_dir,
                stop=stop,
                started=started,
            )
        finally:
            note.cancel()
            paced.cancel()

    return _run_until_signal(main)


def cmd_sim_run(args: argparse.Namespace) -> int:
    from sim.run import run

    return run(args)


def cmd_sim_up(args: argparse.Namespace) -> int:
    from sim.launcher import SimError, describe, up

    try:
        state = up(args.topology, args.dir, timeout=args.timeout, verbose=args.verbose)
    except (SimError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(describe(state))
    return 0


def cmd_sim_down(args: argparse.Namespace) -> int:
    from sim.launcher import SimError, down

    try:
        stopped = down(args.dir, grace=args.grace)
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"stopped {len(stopped)} processes" + "".join(f"\n  {s}" for s in stopped))
    return 0


def cmd_sim_link(args: argparse.Namespace) -> int:
    from sim.launcher import SimError, link_control

    try:
        links = link_control(args.dir, args.op, args.agent)
    except (SimError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, ln in links.items():
        state = "CUT" if ln["cut"] else "up"
        print(f"{name:<16} port={ln['port']} {state:<3} conns={ln['connections']} {ln['profile']}")
    return 0


def version_line() -> str:
    """The release and the wire level it reads (what an upgrade is checked by)."""
    try:
        release = importlib.metadata.version("mars-orchestrator")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        release = "(not installed)"
    return f"mars {release} (wire level {WIRE_LEVEL})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mars", description=__doc__)
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logs (-vv: debug)")
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="cmd", required=True)

    def with_nats(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument(
            "--nats", default=DEFAULT_URL,
            help="NATS URL, or several comma-separated (env MARS_NATS_URL)",
        )  # fmt: skip
        sp.add_argument(
            "--nkey", metavar="SEED_FILE",
            help=f"this identity's nkey seed file (env {connect.ENV_SEED}; `mars deploy`)",
        )  # fmt: skip
        sp.add_argument(
            "--tls-ca", metavar="PEM",
            help=f"CA the server's certificate must chain to (env {connect.ENV_CA})",
        )  # fmt: skip
        return sp

    def retry_connect(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--retry-connect",
            action="store_true",
            help="a NATS server out of reach at start is tried again, with a growing wait, "
            "each failure said on stderr (for systemd and other supervisors); without it, "
            "the process says so and exits with 2",
        )

    a = with_nats(sub.add_parser("agent", help="run an edge agent on this host"))
    a.add_argument("--config", help="agent config YAML")
    a.add_argument("--id", help="stable agent id (default: config or hostname)")
    a.add_argument("--site")
    a.add_argument("--tier", choices=["device", "edge", "fog", "cloud"])
    a.add_argument(
        "--grace", type=float, help="seconds running work may finish on SIGTERM (default: config)"
    )
    retry_connect(a)
    a.set_defaults(fn=cmd_agent)

    dr = with_nats(
        sub.add_parser("drain", help="stop an agent taking new work; running work finishes")
    )
    dr.add_argument("agent_id")
    dr.add_argument("--deadline", type=float, help="cancel what is left after this many seconds")
    dr.add_argument("--resume", action="store_true", help="accept offers again")
    dr.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the reply")
    dr.set_defaults(fn=cmd_drain)

    o = with_nats(sub.add_parser("orchestrator", help="run an orchestrator replica"))
    o.add_argument(
        "--plan-budget-ms",
        type=float,
        default=2.0,
        help=(
            "time the plan portfolio may spend beyond HEFT on a pipeline of up to 20 tasks "
            "placed alone (default 2; 0: HEFT only); larger pipelines get it x (tasks/20)^2, "
            "at most 250 ms; none while other placements are under way"
        ),
    )
    o.add_argument(
        "--keep-hours",
        type=_keep_hours,
        default=24.0,
        help=(
            "how long pipelines' records, specs, leases and results stay in JetStream after "
            "their last write, so after a pipeline ends (default 24; give every replica the "
            "same: each sets the buckets' max age when it starts)"
        ),
    )
    o.add_argument(
        "--booking-key-max-kib",
        type=_kib,
        default=256,
        help=(
            "how big a device's booking key may grow (default 256, ~1,500 booked windows; "
            "never more than the server's max_payload allows): a device at it takes no new "
            "bookings, plans go elsewhere or are refused with that reason"
        ),
    )
    retry_connect(o)
    o.set_defaults(fn=cmd_orchestrator)

    s = with_nats(sub.add_parser("submit", help="submit a pipeline file (YAML or JSON)"))
    s.add_argument("file")
    s.add_argument("--id", help="pipeline id (makes a retried submit idempotent)")
    s.add_argument("--wait", action="store_true", help="wait for the outcome; exit 0 on success")
    s.add_argument("--timeout", type=float, default=300.0)
    s.add_argument("--json", action="store_true")
    s.add_argument(
        "--input", action="append", default=[], metavar="NAME=PATH",
        help="a pipeline input (tasks take it as `pipeline_input: NAME`); stored once, by digest",
    )  # fmt: skip
    s.set_defaults(fn=cmd_submit)

    st = with_nats(sub.add_parser("status", help="show a pipeline"))
    st.add_argument("pipeline_id")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_status)

    g = with_nats(sub.add_parser("get", help="write a task's output to a file"))
    g.add_argument("pipeline_id")
    g.add_argument("task", help="TASK, or TASK:MEMBER for one tensor of an .npz output")
    g.add_argument("-o", "--output", required=True, help="file to write (- for stdout)")
    g.set_defaults(fn=cmd_get)

    ls = with_nats(
        sub.add_parser("list", help="list pipelines, newest first (every replica's, kept ones)")
    )
    ls.add_argument("--state", choices=get_args(PipelineState), help="only those in this state")
    ls.add_argument("--limit", type=_page_size, default=100, help="at most this many (1-1000)")
    ls.add_argument("--offset", type=_offset, default=0, help="skip this many of the newest")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=cmd_list)

    ag = with_nats(sub.add_parser("agents", help="list agents the orchestrator sees"))
    ag.set_defaults(fn=cmd_agents)

    bk = with_nats(
        sub.add_parser("bookings", help="device time booked, read from the bookings bucket")
    )
    bk.add_argument("--device", help="one device: its key (dev.A.D) or its id (A:D)")
    bk.add_argument("--pipeline", help="only this pipeline's windows")
    bk.add_argument("--json", action="store_true")
    bk.set_defaults(fn=cmd_bookings)

    ar = sub.add_parser("artifact", help="models and Python bundles shipped to agents")
    ar_sub = ar.add_subparsers(dest="artifact_cmd", required=True)
    ap = with_nats(
        ar_sub.add_parser("put", help="store a file (.onnx, .zip, .whl); prints NAME@SHA256")
    )
    ap.add_argument("file")
    ap.add_argument("--name", help="its name (default: the file's, without the suffix)")
    ap.add_argument("--kind", choices=["onnx", "python-bundle"], help="default: by the suffix")
    ap.add_argument("--json", action="store_true")
    al = with_nats(ar_sub.add_parser("ls", help="list stored artifacts"))
    al.add_argument("--json", action="store_true")
    arm = with_nats(
        ar_sub.add_parser("rm", help="remove NAME@SHA256, or every artifact named NAME")
    )
    arm.add_argument("target", metavar="NAME|NAME@SHA256")
    for sp in (ap, al, arm):
        sp.set_defaults(fn=cmd_artifact)

    c = with_nats(sub.add_parser("cancel", help="cancel a pipeline"))
    c.add_argument("pipeline_id")
    c.add_argument("--reason", default="")
    c.set_defaults(fn=cmd_cancel)

    sc = sub.add_parser("schema", help="write the JSON Schema of the wire models")
    sc.add_argument("--out", help="directory (default: print to stdout)")
    sc.set_defaults(fn=cmd_schema)

    dp = sub.add_parser(
        "deploy",
        help="hub cluster, site leaf servers, identities, TLS and units from one sites file",
    )
    from console.deploy.command import add_arguments as add_deploy_arguments

    add_deploy_arguments(dp)
    dp.set_defaults(fn=cmd_deploy)

    d = sub.add_parser("demo", help="embedded nats-server + orchestrator + 3 agents + a pipeline")
    d.add_argument("--pipeline", help="pipeline file (default: the video-analytics example)")
    d.add_argument("--timeout", type=float, default=25.0)
    d.set_defaults(fn=cmd_demo)

    sim = sub.add_parser("sim", help="simulation helpers (emulated devices only)")
    sim_sub = sim.add_subparsers(dest="sim_cmd", required=True)
    sa = with_nats(
        sim_sub.add_parser("agents", help="run N real agents with emulated devices in one process")
    )
    sa.add_argument("--count", type=int, required=True, help="number of agents")
    sa.add_argument("--prefix", default="sim", help="agent id prefix (ids are PREFIX-0000...)")
    sa.add_argument("--slots", type=int, default=2, help="slots of each emulated cpu device")
    sa.add_argument("--gflops", type=float, default=50.0, help="declared GFLOP/s per device")
    sa.add_argument("--site-count", type=int, default=4, help="sites the agents spread over")
    sa.add_argument("--heartbeat", type=float, default=0.5, help="heartbeat interval (s)")
    sa.add_argument(
        "--shared-connection",
        action="store_true",
        help="all agents on one NATS connection (their messages unchanged; judged by "
        "heartbeats only, no per-agent disconnect advisory)",
    )
    sa.add_argument(
        "--state-dir",
        help="keep each agent's event journal and outputs under DIR/<agent-id>, across "
        "restarts (default: a temp directory per agent, removed when it stops)",
    )
    sa.set_defaults(fn=cmd_sim_agents)
    sr = sim_sub.add_parser("run", help="discrete-event simulation scenario (docs/sim.md)")
    add_sim_run_arguments(sr)
    sr.set_defaults(fn=cmd_sim_run)
    su = sim_sub.add_parser(
        "up", help="start nats-server, orchestrator and agents behind emulated links (docs/sim.md)"
    )
    su.add_argument("topology", help="topology YAML (e.g. sim/topologies/small.yaml)")
    su.add_argument("--dir", default=".mars-sim", help="run directory: state, configs, logs")
    su.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for agents")
    su.set_defaults(fn=cmd_sim_up)
    sd = sim_sub.add_parser("down", help="stop everything `mars sim up` started")
    sd.add_argument("--dir", default=".mars-sim")
    sd.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    sd.set_defaults(fn=cmd_sim_down)
    sl = sim_sub.add_parser("link", help="cut, restore or show an agent's emulated link")
    sl.add_argument("op", choices=["cut", "restore", "show"])
    sl.add_argument("agent", nargs="?", help="agent id (default: every link)")
    sl.add_argument("--dir", default=".mars-sim")
    sl.set_defaults(fn=cmd_sim_link)
    for api in (s, st, g, ls, ag, c):  # asked as a user: its own pipelines alone
        api.add_argument(
            "--user", type=_user, default=os.environ.get("MARS_USER") or None,
            help="ask as this user (env MARS_USER): the API's subjects that end in its name, "
            "where it sees and cancels its own pipelines alone; unset: the admin's subjects",
        )  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from orchestrator.infra import logs

    args = build_parser().parse_args(argv)
    logs.setup(args.verbose)
    # an identity given as a flag is the process's, as if `mars.env` had said it: every
    # connection it makes (services, clients, the reachability check) uses it
    for flag, env in (("nkey", connect.ENV_SEED), ("tls_ca", connect.ENV_CA)):
        if getattr(args, flag, None):
            os.environ[env] = str(Path(getattr(args, flag)).resolve())
    if getattr(args, "nats", None) is not None:
        try:
            connect.Credentials.from_env()
        except connect.CredentialsError as exc:
            print(f"mars: {exc}", file=sys.stderr)
            return 2
    try:
        rc: int = args.fn(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is met below
    except BrokenPipeError:
        return _stdout_gone()
    return rc


def _stdout_gone() -> int:
    """Whoever read the output stopped (`mars list | head`): quiet, as a Unix tool that
    SIGPIPE ended, and with its exit status. What is still buffered goes nowhere: written
    at exit it would fail again, with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
