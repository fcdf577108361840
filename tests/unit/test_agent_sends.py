"""The orchestrator writes every message to an agent through `Orchestrator.ask_agent` or
`tell_agent`, which encode it at the level the agent reads: a send that built an agent's
subject itself could forget the level, and an agent of an older release would refuse what
it carried (tests/integration/test_wire_levels.py has the behaviour)."""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator

# subjects an agent serves (schemas/subjects.py); the orchestrator names them only as
# functions handed to the helpers, never calls them
AGENT_SUBJECTS = {"offer", "offers", "commit", "cancel", "job", "fetch", "data", "probe", "drain"}
# `mars drain` talks to one agent from the command line, with no view of its level
ALLOWED = {("cli.py", "drain")}


def agent_subjects_built(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and f.value.id == "subjects"
            and f.attr in AGENT_SUBJECTS
        ):
            out.append((f.attr, node.lineno))
    return out


def test_no_orchestrator_module_builds_an_agent_subject_itself() -> None:
    root = Path(orchestrator.__file__).parent
    found = {
        f"{p.relative_to(root)}:{line} subjects.{name}(...)"
        for p in sorted(root.rglob("*.py"))
        for name, line in agent_subjects_built(p)
        if (str(p.relative_to(root)), name) not in ALLOWED
    }
    assert found == set(), "send through Orchestrator.ask_agent / tell_agent instead"


def test_the_check_sees_a_subject_built_by_hand(tmp_path: Path) -> None:
    """The scan above finds the shape it forbids (so an empty result means something)."""
    src = tmp_path / "m.py"
    src.write_text(
        "async def f(nc, cmd, a):\n"
        "    await nc.publish(subjects.cancel(a), encode(cmd))\n"
        "    return subjects.advert(a), subjects.cancel\n"
    )
    assert agent_subjects_built(src) == [("cancel", 2)]
