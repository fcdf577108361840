"""Allowlists for `exec` and `python` tasks: pure rules, admission, and slot bounds."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from edge_agent.allowlist import Allowlist, ExecRule, match_exec, python_problem
from edge_agent.config import AgentConfig
from edge_agent.core import AgentCore
from schemas import CommitCommand, DeviceSpec, TaskOffer, TaskSpec

PRINTF = shutil.which("printf") or "/usr/bin/printf"
RULES = (
    ExecRule(path="printf", prefix=["%s\\0"], args=[r"[A-Za-z0-9 ._-]*"], max_args=4),
    ExecRule(path="true"),
)
# what a hostile task might name instead of an allowlisted executable
HOSTILE_EXES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["sh", "/bin/sh", "bash", "rm", "touch", "./printf", "../printf", "printf "]),
    st.sampled_from(["/tmp/printf", "bin/printf", "/usr/bin/printf/", "PRINTF", "true;rm"]),
)
ARGS = st.lists(st.text(max_size=30), max_size=6)


def test_rule_resolves_bare_names_at_load_and_refuses_unknowns() -> None:
    assert RULES[0].path == PRINTF and RULES[0].name == "printf"
    with pytest.raises(ValidationError, match="not found on PATH"):
        ExecRule(path="no-such-program-mars")
    with pytest.raises(ValidationError, match="absolute path or a bare name"):
        ExecRule(path="bin/printf")
    with pytest.raises(ValidationError, match="not an executable"):
        ExecRule(path="/etc")
    with pytest.raises(ValidationError, match="bad pattern"):
        ExecRule(path="true", args=["("])
    cfg = AgentConfig.model_validate({"exec_allow": [{"path": "true"}], "python_allow": ["a.b"]})
    assert cfg.exec_allow[0].path == shutil.which("true")
    # a dumped config validates again to the same rules (the CLI re-validates it)
    assert AgentConfig.model_validate(cfg.model_dump()) == cfg
    with pytest.raises(ValidationError):
        AgentConfig.model_validate({"python_allow": ["os; rm"]})


def test_match_exec_checks_name_prefix_patterns_and_count() -> None:
    assert match_exec(["printf", "%s\\0", "a b", "c"], RULES) == (
        [PRINTF, "%s\\0", "a b", "c"],
        "",
    )
    assert match_exec([PRINTF, "%s\\0"], RULES)[0] == [PRINTF, "%s\\0"]
    assert match_exec(["true"], RULES)[0] == [shutil.which("true")]
    cases = {
        ("touch", "/tmp/x"): "not allowlisted",
        ("printf", "%d"): "must start with",
        ("printf", "%s\\0", "$(id)"): "matches no allowed pattern",
        ("printf", "%s\\0", "a", "b", "c", "d", "e"): "at most 4",
        ("true", "extra"): "takes no arguments",
        ("printf", "%s\\0", "a\x00b"): "NUL",
    }
    for argv, why in cases.items():
        out, reason = match_exec(list(argv), RULES)
        assert out is None and why in reason, (argv, reason)


@settings(max_examples=300, deadline=None)
@given(exe=HOSTILE_EXES, args=ARGS)
def test_unlisted_executables_never_pass(exe: str, args: list[str]) -> None:
    argv, why = match_exec([exe, *args], RULES)
    if exe in ("printf", "true", PRINTF, shutil.which("true")):
        return  # listed: judged on its arguments, covered below
    assert argv is None and why


@settings(max_examples=300, deadline=None)
@given(args=ARGS)
def test_passed_argv_is_verbatim_and_runs_the_rule_path(args: list[str]) -> None:
    argv, _ = match_exec(["printf", "%s\\0", *args], RULES)
    if argv is None:
        return
    assert argv[0] == PRINTF  # always the configured absolute path, never a PATH lookup
    assert argv[1:] == ["%s\\0", *args]  # untouched: no shell, no splitting, no expansion
    assert all(c.isalnum() or c in " ._-" for a in args for c in a)


@given(args=st.lists(st.text(alphabet=";|&$`<>*?(){}[]\\'\"\n", min_size=1), min_size=1))
def test_shell_metacharacters_fail_a_strict_pattern(args: list[str]) -> None:
    assert match_exec(["printf", "%s\\0", *args], RULES)[0] is None


def test_python_allowlist_is_by_module_and_package_prefix() -> None:
    mods = ["edge_agent.builtin_tasks", "mytasks"]
    assert python_problem("edge_agent.builtin_tasks:checksum", mods) is None
    assert python_problem("mytasks.sub.deep:run", mods) is None
    assert "not allowlisted" in (python_problem("mytasksx:run", mods) or "")
    assert "not allowlisted" in (python_problem("os:system", mods) or "")
    assert "not allowlisted" in (python_problem("edge_agent:x", mods) or "")
    assert "private" in (python_problem("mytasks:_secret", mods) or "")


@given(module=st.from_regex(r"[A-Za-z_]\w{0,8}(\.[A-Za-z_]\w{0,8}){0,3}", fullmatch=True))
def test_modules_outside_the_allowlist_never_pass(module: str) -> None:
    mods = ["edge_agent.builtin_tasks"]
    ok = module == mods[0] or module.startswith(mods[0] + ".")
    assert (python_problem(f"{module}:f", mods) is None) == ok


# -- admission --------------------------------------------------------------------------------
def _core(slots: int = 1) -> AgentCore:
    devices = [DeviceSpec(device_id="cpu0", kind="cpu", slots=slots, memory_mb=1000.0)]
    allow = Allowlist(RULES, ("edge_agent.builtin_tasks",))
    return AgentCore("a1", "inc1", devices, ["synthetic", "exec", "python"], allowlist=allow)


def _offer(run: dict[str, Any], task_id: str = "t", order: int = 0) -> TaskOffer:
    task = TaskSpec.model_validate({"id": task_id, "run": run})
    return TaskOffer(
        pipeline_id="p", agent_id="a1", incarnation="inc1", device_id="cpu0", token=1,
        order=order, task=task,
    )  # fmt: skip


def test_admission_rejects_what_the_allowlist_refuses() -> None:
    c = _core()
    bad: list[dict[str, Any]] = [
        {"kind": "exec", "argv": ["touch", "/tmp/pwned"]},
        {"kind": "exec", "argv": ["sh", "-c", "printf x"]},
        {"kind": "exec", "argv": ["printf", "%s\\0", "$(id)"]},
        {"kind": "python", "entry": "os:system", "kwargs": {"command": "id"}},
        {"kind": "python", "entry": "edge_agent.builtin_tasks:_secret"},
    ]
    for i, run in enumerate(bad):
        r = c.admit(_offer(run, f"t{i}"))
        assert not r.accepted and r.code == "not_allowlisted" and r.reason, run
    assert not c.jobs
    assert c.admit(_offer({"kind": "exec", "argv": ["printf", "%s\\0", "ok"]}, "e")).accepted
    assert c.admit(_offer({"kind": "python", "entry": "edge_agent.builtin_tasks:pause"})).accepted
    # a kind the agent does not run at all is refused before any allowlist is consulted
    plain = AgentCore("a1", "inc1", list(c.devices.values()), ["synthetic"])
    r = plain.admit(_offer({"kind": "exec", "argv": ["printf", "%s\\0"]}))
    assert r.code == "kind_not_allowed"
    # allowed kind, empty allowlist: nothing passes
    empty = AgentCore("a1", "inc1", list(c.devices.values()), ["exec"])
    assert empty.admit(_offer({"kind": "exec", "argv": ["true"]})).code == "not_allowlisted"


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_take_ready_never_runs_more_than_the_slots(slots: int) -> None:
    c = _core(slots)
    runs: list[dict[str, Any]] = [
        {"kind": "synthetic"},
        {"kind": "exec", "argv": ["true"]},
        {"kind": "python", "entry": "edge_agent.builtin_tasks:pause"},
    ]
    ids = [f"t{i}" for i in range(10)]
    for i, tid in enumerate(ids):
        assert c.admit(_offer(runs[i % 3], tid, order=i)).accepted
    c.commit(CommitCommand(pipeline_id="p", task_ids=ids))
    running: set[str] = set()
    done: list[str] = []
    most = 0
    while len(done) < len(ids):
        running |= {j.offer.task.id for j in c.take_ready()}
        most = max(most, len(running))
        assert len(running) == c.running_total <= slots
        tid = min(running)
        c.finish(("p", tid), ok=True)
        running.discard(tid)
        done.append(tid)
    assert most == slots
    assert sorted(done) == sorted(ids)


def test_abandon_drops_queued_and_returns_running() -> None:
    c = _core(1)
    for i in range(3):
        c.admit(_offer({"kind": "synthetic"}, f"t{i}", order=i))
    c.commit(CommitCommand(pipeline_id="p", task_ids=["t0", "t1", "t2"]))
    c.take_ready()
    out = {j.offer.task.id: j.state for j in c.abandon()}
    assert out == {"t0": "running", "t1": "cancelled", "t2": "cancelled"}
    assert list(c.jobs) == [("p", "t0")]
    assert c.admit(_offer({"kind": "synthetic"}, "t1", order=1)).code == "duplicate"
