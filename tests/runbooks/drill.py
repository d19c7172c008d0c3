"""Runbook pages as executable drills.

A page (docs/runbooks/*.md) marks the shell blocks a drill runs with the fence info string
``bash drill=<step>``. This module parses the pages and runs a page's blocks as written,
with `bash`, with the page's variables ($CONFIG, ...) set in the environment and the
project's virtualenv first on PATH, so `streamberg` is the real command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"
# ```bash drill=fix   (fences may be indented inside list items)
_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_VARIABLE = re.compile(r"\$\{?([A-Z][A-Z0-9_]*)\}?")
SECTIONS = ("## Symptoms", "## Confirm", "## Fix", "## Check it worked")


@dataclass(frozen=True)
class Block:
    info: str
    body: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def drill(self) -> str | None:
        match = re.search(r"\bdrill=([\w-]+)", self.info)
        return match.group(1) if match else None

    def lines(self) -> list[str]:
        """Logical lines (backslash continuations joined), without comments and blanks."""
        joined = self.body.replace("\\\n", " ")
        return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]

    def variables(self) -> set[str]:
        return set(_VARIABLE.findall(self.body))


@dataclass
class Page:
    path: Path
    text: str
    blocks: list[Block] = field(default_factory=list)

    @classmethod
    def load(cls, name: str) -> Page:
        path = RUNBOOKS / name
        text = path.read_text()
        blocks = [Block(m.group("info").strip(), textwrap.dedent(m.group("body"))) for m in _FENCE.finditer(text)]
        return cls(path, text, blocks)

    @property
    def prose(self) -> str:
        """The page without its code blocks (where variables must be documented)."""
        return _FENCE.sub("", self.text)

    def drill(self, name: str) -> Block:
        found = [b for b in self.blocks if b.drill == name]
        assert len(found) == 1, f"{self.path.name}: expected one block marked drill={name}, found {len(found)}"
        return found[0]


def pages() -> list[Page]:
    return [Page.load(p.name) for p in sorted(RUNBOOKS.glob("*.md")) if p.name != "README.md"]


@dataclass
class Result:
    step: str
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"drill step {self.step!r}: stdout is not one JSON document ({exc}):\n"
                                 f"{self.stdout[-2000:]}\nstderr:\n{self.stderr[-2000:]}") from None

    def expect(self, *codes: int) -> Result:
        assert self.returncode in codes, (f"drill step {self.step!r} exited {self.returncode}, expected {codes}\n"
                                          f"stdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}")
        return self


class Background:
    """A drill block running in its own process group (a long-running `streamberg ingest`)."""

    def __init__(self, step: str, proc: subprocess.Popen, log: Path):
        self.step, self.proc, self.log = step, proc, log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def command_pid(self) -> int:
        """The pid of the block's command: bash execs a one-command block, else its only child."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        if Path(f"/proc/{self.proc.pid}/comm").read_text().strip() != "bash" or not children.exists():
            return self.proc.pid
        kids = children.read_text().split()
        assert len(kids) == 1, f"{self.step}: bash runs {len(kids)} commands; a drill block to stop must run one"
        return int(kids[0])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def signal(self, signum: int) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signum)

    def stop(self, timeout: float = 120) -> int:
        """Ctrl-C, as an operator stops it; SIGKILL if it has not exited in time."""
        self.signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(30)
            raise AssertionError(f"drill step {self.step!r} did not stop within {timeout} s:\n{self.output()[-3000:]}") from None


class Drill:
    """Runs one page's drill blocks with the given variables."""

    def __init__(self, page: str, workdir: Path, **variables: str):
        self.page = Page.load(page)
        self.workdir = workdir
        self.variables = variables
        self.background: list[Background] = []

    def _env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        return {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                "STREAMBERG_LOG_FORMAT": "json", **self.variables}

    def _command(self, step: str) -> list[str]:
        block = self.page.drill(step)
        missing = block.variables() - set(self.variables) - {"PATH", "HOME"}
        assert not missing, f"{self.page.path.name} drill={step} uses unset variables {sorted(missing)}"
        # -e: a failing command fails the step; one simple command is exec'd by bash, so its
        # exit status and signals are the command's own.
        return ["bash", "-euo", "pipefail", "-c", block.body]

    def run(self, step: str, timeout: float = 300) -> Result:
        proc = subprocess.run(self._command(step), capture_output=True, text=True, timeout=timeout,
                              env=self._env(), cwd=self.workdir)
        return Result(step, proc.returncode, proc.stdout, proc.stderr)

    def start(self, step: str) -> Background:
        log = self.workdir / f"drill-{step}-{len(self.background)}.log"
        proc = subprocess.Popen(self._command(step), stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                start_new_session=True, env=self._env(), cwd=self.workdir)
        running = Background(step, proc, log)
        self.background.append(running)
        return running

    def close(self) -> None:
        """Kill whatever is still running (a failed assertion must not leave JVMs behind)."""
        for running in self.background:
            if running.alive():
                running.signal(signal.SIGKILL)
                running.proc.wait(30)


@pytest.fixture
def drills(tmp_path: Path):
    """Drills of one test; whatever they left running is killed at the end."""
    made: list[Drill] = []

    def make(page: str, **variables: str) -> Drill:
        made.append(Drill(page, tmp_path, **variables))
        return made[-1]

    yield make
    for drill in made:
        drill.close()

