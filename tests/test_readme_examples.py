"""The README's examples run against a live demo server and answer what the README shows.

Every bash block that calls ``localhost:8000`` runs command by command (``curl`` and the
``python3 -c`` that writes a request); a command followed by an answer in comments (``# {...``
and ``#   ...`` continuation lines) must answer exactly that, where ``...`` stands for
anything. Every python block that talks to the server runs too, and each ``print`` line's
trailing ``# comment`` is the line it must print. So the README cannot drift from the server.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ortserve.demo import write_demo_repository
from ortserve.llm.demo import write_demo_llm
from ortserve.testing import ServerProcess, run_server

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parent.parent / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Command:
    text: str
    shown: str | None
    """The answer the README shows after it (``...`` elides), None when it shows none."""


def blocks(language: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(README.read_text()) if lang == language]


def live_blocks(language: str) -> list[str]:
    return [body for body in blocks(language) if "localhost:800" in body]


def commands(block: str) -> list[Command]:
    """The block's commands (a quoted argument may span lines), each with its shown answer."""
    lines = block.splitlines()
    found: list[Command] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.strip() or line.lstrip().startswith("#"):
            index += 1
            continue
        text = [line]
        while _open_quote("\n".join(text)):
            index += 1
            text.append(lines[index])
        index += 1
        shown: list[str] = []
        if index < len(lines) and lines[index].startswith("# {"):
            shown.append(lines[index][2:])
            index += 1
            while index < len(lines) and lines[index].startswith("#   "):
                shown.append(lines[index][4:])
                index += 1
        found.append(Command("\n".join(text), "".join(shown) or None))
    return found


def _open_quote(text: str) -> bool:
    code = re.sub(r"#[^'\n]*$", "", text, flags=re.MULTILINE)  # trailing comments hold quotes
    return code.count("'") % 2 == 1


def matches(shown: str, answer: str) -> bool:
    """``answer`` (compact JSON) is what ``shown`` says, ``...`` standing for anything."""
    pattern = ".*?".join(re.escape(part) for part in shown.split("..."))
    return re.fullmatch(pattern, answer, re.DOTALL) is not None


def compact(text: str) -> str:
    return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``ortserve serve --demo``'s repository: the MLPs, the seed apps and tiny_llm."""
    root = tmp_path_factory.mktemp("readme") / "models"
    write_demo_repository(root)
    write_demo_llm(root)
    log = root.parent / "server.log"
    with run_server(root, log, ["--metrics-port", "-1"]) as server:
        yield server


def local(text: str, server: ServerProcess) -> str:
    return text.replace("localhost:8000", server.http_address).replace("localhost:8001", server.grpc_address)


def test_the_readme_has_the_examples_this_test_runs() -> None:
    shown = [c for block in live_blocks("bash") for c in commands(block) if c.shown]
    assert len(shown) >= 3  # the infer call and the two seed applications
    assert len(live_blocks("python")) >= 3  # tritonclient HTTP and gRPC, openai


@pytest.mark.parametrize("block", range(len(live_blocks("bash"))))
def test_each_curl_example_answers_what_the_readme_shows(
    demo: ServerProcess, tmp_path: Path, block: int
) -> None:
    for command in commands(live_blocks("bash")[block]):
        run = subprocess.run(
            ["bash", "-c", local(command.text, demo)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, (command.text, run.stderr)
        if command.shown is not None:
            answer = compact(run.stdout)
            assert matches(command.shown, answer), (
                f"README shows\n{command.shown}\nthe server answers\n{answer}"
            )


@pytest.mark.parametrize("block", range(len(live_blocks("python"))))
def test_each_python_example_prints_what_the_readme_shows(
    demo: ServerProcess, tmp_path: Path, block: int
) -> None:
    code = local(live_blocks("python")[block], demo)
    expected = [
        line.split("#", 1)[1].strip()
        for line in code.splitlines()
        if line.startswith("print(") and "#" in line
    ]
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    if expected:
        assert run.stdout.splitlines() == expected


def test_the_pattern_checker_elides_only_what_the_readme_elides() -> None:
    assert matches('{"a":1,"b":[...],"c":"x"}', '{"a":1,"b":[1,2,3],"c":"x"}')
    assert not matches('{"a":1,"b":[...],"c":"x"}', '{"a":2,"b":[1],"c":"x"}')
    assert not matches('{"a":1}', '{"a":1,"new":true}')
