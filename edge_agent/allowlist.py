"""What an agent may run: exec rules and python modules. Pure, so admission and the executors
ask the very same question (checked once when the offer arrives, again just before running).

Exec rules: a task's argv[0] names an executable by the rule's absolute path or its bare name;
the agent always runs the rule's absolute path (no PATH lookup at run time, never a shell).
Then `prefix` fixed arguments must follow verbatim, and every further argument must fully
match one of the rule's `args` regexes (none allowed when `args` is empty), at most `max_args`.

Python: `module:function` where the module equals an allowlisted name or lies under it
(`pkg` allows `pkg.sub`), and the function is public. A task whose code is shipped with it
(`PythonRun.bundle`) needs no module allowlisted, but the agent's owner must allow shipped
code at all (`allow_shipped_code`); its function must be public too.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from schemas.pipeline import Arg, ExecRun, PythonRun, RunSpec

ArgPattern = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
ModuleName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", max_length=256)
]


class ExecRule(BaseModel):
    """One allowlisted executable and the arguments it may be given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Absolute path, or a bare name resolved with `shutil.which` when the config loads.
    path: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    #: Arguments that must follow the executable verbatim.
    prefix: Annotated[list[Arg], Field(max_length=64)] = Field(default_factory=list)
    #: Each argument after the prefix must fully match one of these regexes.
    args: Annotated[list[ArgPattern], Field(max_length=64)] = Field(default_factory=list)
    #: Most arguments allowed after the prefix.
    max_args: Annotated[int, Field(ge=0, le=64)] = 16

    @field_validator("path")
    @classmethod
    def _resolve(cls, path: str) -> str:
        if "/" not in path:
            found = shutil.which(path)
            if found is None:
                raise ValueError(f"{path!r} not found on PATH")
            path = os.path.abspath(found)
        elif not os.path.isabs(path):
            raise ValueError(f"{path!r} must be an absolute path or a bare name")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ValueError(f"{path!r} is not an executable file")
        return path

    @field_validator("args")
    @classmethod
    def _compile(cls, patterns: list[str]) -> list[str]:
        for pat in patterns:
            try:
                re.compile(pat)
            except re.error as exc:
                raise ValueError(f"bad pattern {pat!r}: {exc}") from exc
        return patterns

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def _arg_problem(rule: ExecRule, args: Sequence[str]) -> str | None:
    n = len(rule.prefix)
    if list(args[:n]) != rule.prefix:
        return f"arguments must start with {rule.prefix!r}"
    extra = args[n:]
    if extra and not rule.args:
        return f"takes no arguments after {rule.prefix!r}"
    if len(extra) > rule.max_args:
        return f"{len(extra)} arguments after the prefix, at most {rule.max_args} allowed"
    for i, arg in enumerate(extra):
        if not any(re.fullmatch(p, arg) for p in rule.args):
            return f"argument {n + i + 1} {arg[:64]!r} matches no allowed pattern"
    return None


def match_exec(argv: Sequence[str], rules: Sequence[ExecRule]) -> tuple[list[str] | None, str]:
    """The argv to run (argv[0] replaced by the rule's absolute path), or None and why not."""
    if not argv:
        return None, "empty argv"
    if any("\x00" in a for a in argv):
        return None, "argv contains a NUL byte"
    exe = argv[0]
    candidates = [r for r in rules if exe == r.path or ("/" not in exe and exe == r.name)]
    if not candidates:
        return None, f"executable {exe[:128]!r} is not allowlisted"
    why = ""
    for rule in candidates:
        problem = _arg_problem(rule, argv[1:])
        if problem is None:
            return [rule.path, *argv[1:]], ""
        why = why or problem
    return None, f"{exe[:128]}: {why}"


def python_problem(entry: str, modules: Sequence[str]) -> str | None:
    """None when `module:function` may be called, else why not."""
    module, sep, fn = entry.partition(":")
    if not sep or not module or not fn:
        return f"entry {entry[:128]!r} is not module:function"
    if fn.startswith("_"):
        return f"entry {entry[:128]!r}: private functions are never callable"
    if not any(module == m or module.startswith(m + ".") for m in modules):
        return f"module {module[:128]!r} is not allowlisted"
    return None


SHIPPED_CODE_OFF = (
    "shipped code is not allowed by this agent's owner (allow_shipped_code is off in its config)"
)


def bundle_problem(entry: str, allowed: bool) -> str | None:
    """None when shipped code may run `entry` here, else why not."""
    if not allowed:
        return SHIPPED_CODE_OFF
    _, sep, fn = entry.partition(":")
    if not sep or not fn:
        return f"entry {entry[:128]!r} is not module:function"
    if fn.startswith("_"):
        return f"entry {entry[:128]!r}: private functions are never callable"
    return None


@dataclass(frozen=True)
class Allowlist:
    """Everything beyond synthetic/onnx that this agent's operator allowed."""

    exec_rules: tuple[ExecRule, ...] = ()
    python_modules: tuple[str, ...] = field(default=())
    #: `python` tasks whose code is shipped with them may run (`allow_shipped_code`).
    shipped_code: bool = False

    def problem(self, run: RunSpec) -> str | None:
        """None when `run` passes the allowlist (kinds without one always pass)."""
        if isinstance(run, ExecRun):
            argv, why = match_exec(run.argv, self.exec_rules)
            return None if argv is not None else why
        if isinstance(run, PythonRun):
            if run.bundle is not None:
                return bundle_problem(run.entry, self.shipped_code)
            return python_problem(run.entry, self.python_modules)
        return None
