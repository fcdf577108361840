"""tools/arch_report.py on tiny synthetic packages: it finds exactly the cycles, lazy imports,
private accesses, rule breaks and submission path planted there."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

# `tools/` is a plain directory of scripts, not a package: imported by name at run time (as
# `-m tools.arch_report` does), mypy checks the tool as the file it is given, not twice.
arch_report = importlib.import_module("tools.arch_report")


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_cycles_lazy_imports_and_private_accesses(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "orchestrator/__init__.py": "",
            # a <-> b: a cycle at import; c -> a only inside a function (lazy)
            "orchestrator/a.py": """
                from orchestrator import b, c

                def fa():
                    return b, c
            """,
            "orchestrator/b.py": "from . import a\n",
            "orchestrator/e.py": "_secret = 1\n",
            "orchestrator/c.py": """
                import orchestrator.e as bee


                class C:
                    def __init__(self, other):
                        self._own = 1  # its own state: fine
                        self.other = other

                    def peek(self):
                        return bee._secret + self._own + self.other._hidden

                    def __repr__(self):
                        return super()._x()


                def same(c):
                    return c._own  # its module's own class: counted, flagged as its own


                def later():
                    from orchestrator import a

                    return a
            """,
            "orchestrator/d.py": "from orchestrator.e import _secret\n",
            # left out: not product packages
            "tests/test_x.py": "from orchestrator.b import _secret\n",
            "tools/t.py": "import orchestrator.b\nprint(orchestrator.b._secret)\n",
        },
    )
    r = arch_report.analyze(tmp_path)

    assert r["rooms"] == [{"room": "orchestrator", "modules": 6, "lines": 20}]
    cycles = r["import_cycles"]
    assert cycles["eager"] == [["orchestrator.a", "orchestrator.b"]]
    assert cycles["eager+lazy"] == [["orchestrator.a", "orchestrator.b", "orchestrator.c"]]
    assert cycles["lazy_edges"] == [["orchestrator.c", "orchestrator.a"]]

    p = r["private_access"]
    found = {(a["file"], a["line"], a["text"], a["category"]) for a in p["accesses"]}
    assert found == {
        ("orchestrator/c.py", 11, "bee._secret", "direct"),
        ("orchestrator/c.py", 11, "self.other._hidden", "back-reference"),
        ("orchestrator/c.py", 18, "c._own", "direct"),
        ("orchestrator/d.py", 1, "from orchestrator.e import _secret", "import"),
    }
    assert (p["total"], p["own_name"]) == (4, 1)
    assert p["per_file"] == {"orchestrator/c.py": 3, "orchestrator/d.py": 1}
    assert r["rules"]["violations"] == []

    largest = r["largest_functions"][0]
    assert (largest["function"], largest["lines"]) == ("later", 4)


def test_rules_and_submission_path(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "schemas/__init__.py": "",
            "schemas/api.py": "from orchestrator import service\n",
            "sim/__init__.py": "",
            "orchestrator/__init__.py": "",
            "orchestrator/cli.py": "import sim\nfrom orchestrator import service\n",
            "orchestrator/predictor/__init__.py": "import sim\nfrom orchestrator import commits\n",
            "orchestrator/service.py": """
                from orchestrator.commits import Commits
                from orchestrator.submissions import Submissions


                class Orchestrator:
                    def __init__(self):
                        self.submissions = Submissions(self)
                        self.commits = Commits(self)

                    def spawn(self, coro):
                        return coro

                    async def start(self, svc):
                        for name, handler in [("submit", self.submissions.enqueue)]:
                            svc.add(name, handler)
            """,
            "orchestrator/submissions.py": """
                from __future__ import annotations

                import asyncio
                import functools
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from orchestrator.service import Orchestrator


                class Submissions:
                    def __init__(self, o: Orchestrator) -> None:
                        self.o = o
                        self.queue = asyncio.Queue()

                    async def enqueue(self, req):
                        self.queue.put_nowait(req)

                    async def worker(self):
                        queue = self.queue
                        req = await queue.get()
                        served = functools.partial(self.submit)
                        await served(req)

                    async def submit(self, req):
                        o = self.o
                        o.spawn(o.commits.commit_all(req))
            """,
            "orchestrator/commits.py": """
                from schemas.placement import CommitCommand


                class Commits:
                    def __init__(self, o):
                        self.o = o

                    async def commit_all(self, run):
                        return CommitCommand(pipeline_id=run)
            """,
        },
    )
    r = arch_report.analyze(tmp_path)

    rules = r["rules"]
    assert [v.split(" (")[0] for v in rules["violations"]] == [
        "orchestrator imports sim: orchestrator.predictor -> sim",
        "predictor imports orchestrator outside predictor/scheduling: "
        "orchestrator.predictor -> orchestrator.commits",
        "schemas imports a service/sim module: schemas.api -> orchestrator.service",
    ]
    assert rules["service_importers"] == {
        "orchestrator.cli": ["eager"],
        "orchestrator.submissions": ["typing"],
        "schemas.api": ["eager"],
    }
    cycles = r["import_cycles"]
    assert cycles["eager+lazy"] == []
    assert cycles["all (with TYPE_CHECKING)"] == [
        ["orchestrator.service", "orchestrator.submissions"]
    ]

    s = r["submission"]
    assert s["static_estimate"] is True
    assert s["entry"] == "orchestrator.submissions.Submissions.enqueue"
    assert s["targets"] == ["orchestrator.commits.Commits.commit_all"]
    assert [(step["function"].rsplit(".", 1)[1], step["via"]) for step in s["path"]] == [
        ("enqueue", "entry"),
        ("worker", "queue"),
        ("submit", "ref"),
        ("commit_all", "call"),
    ]
    assert s["functions_on_path"] == 4
    assert "STATIC ESTIMATE" in arch_report.render(r)
