"""The docs cannot drift from the server: every runnable example in README.md and docs/ runs against a real server
on the suite's artifacts, and what the page prints is what the server answers.

A block runs when an HTML comment right above it names its servers, `<!-- example: 8080=minilm --api-key KEY;
8081=ranking -->` (SERVERS below), or says why it does not run, `<!-- example: not run: REASON -->`; every block
with a curl to 127.0.0.1 or localhost must have one. `<!-- example: answer -->` marks a block that shows the answer
to the last command of the example above it, apart from it (so that the command pastes alone). In a shell block
each `curl` command (with its pipe and continuation lines) runs in bash against those servers, and the lines after
it, up to the next command, are its answer; other lines (building and serving the model) are what the servers
stand for. A Python block runs whole, and a `# comment` after a `print(...)` is that line's output. Answers are
compared token by token: strings, integers and punctuation exactly; floats, ids, timestamps and `...` (any run of
tokens) by kind only, as they depend on the host. A status line and headers (`curl -D -`): the status exactly,
every header shown present, and the value of those in EXACT_HEADERS. Links between the pages, and their anchors,
resolve, and every option of `infinity serve` and `multiverse` is on its page."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.servers import running

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--\s*example:\s*(.*?)\s*-->")
NOT_RUN = "not run:"
ANSWER = "answer"
LOCAL_URL = re.compile(r"(?:127\.0\.0\.1|localhost):(\d+)")
# the servers an example may name: a suite artifact by (task, precision), built as the other tests build it
SERVERS: dict[str, tuple[str, str]] = {
    "minilm": ("feature-extraction", "fp32"),
    "minilm-int8": ("feature-extraction", "int8"),
    "ranking": ("ranking", "fp32"),
    "sequence-classification": ("sequence-classification", "fp32"),
    "token-classification": ("token-classification", "fp32"),
    "sparse": ("sparse-embedding", "fp32"),
    "multi-vector": ("multi-vector", "fp32"),
    "hybrid": ("hybrid-embedding", "fp32"),
    "sparse-int8": ("sparse-embedding", "int8"),
    "multi-vector-int8": ("multi-vector", "int8"),
    "hybrid-int8": ("hybrid-embedding", "int8"),
}
EXACT_HEADERS = {"content-type", "server", "www-authenticate", "retry-after", "x-compute-tokens", "allow"}
TOKEN = re.compile(r"""(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<more>\.\.\.)"""
                   r"""|(?P<float>-?\d+\.\d*(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+)|(?P<int>-?\d+)"""
                   r"""|(?P<word>[A-Za-z_][\w.-]*)|(?P<mark>\S)""")
ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
TIMESTAMP_DIGITS = 10


@dataclass
class Step:
    source: str  # a shell command, or a whole Python program
    expected: list[str] = field(default_factory=list)  # its answer's lines (Python: one per commented print)


@dataclass
class Example:
    page: Path
    line: int
    servers: dict[int | str, tuple[str, tuple[str, ...]]]  # port (or artifact directory) in the page -> (SERVERS
    # name, serve flags)
    python: bool
    steps: list[Step]

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(text: str) -> Iterator[tuple[int, str | None, str, list[str]]]:
    """(first line number, the marker above it or None, language, lines) of every fenced or indented code block."""
    lines = text.splitlines()
    i, marker = 0, None
    while i < len(lines):
        line = lines[i]
        if found := MARKER.fullmatch(line.strip()):
            marker = found.group(1)
        elif line.startswith("```"):
            language, body, i = line[3:].strip(), [], i + 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            yield i - len(body), marker, language, body
            marker = None
        elif line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip() or marker):
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            while body and not body[-1].strip():
                body.pop()
            yield i - len(body), marker, "", body
            marker = None
            continue
        elif line.strip():
            marker = None
        i += 1


def servers_of(marker: str) -> dict[int | str, tuple[str, tuple[str, ...]]]:
    """Each port (`8080=NAME FLAGS`), or artifact directory as the page names it (`artifacts/x=NAME`: a Python block
    that loads it in-process), and the suite artifact it stands for."""
    named: dict[int | str, tuple[str, tuple[str, ...]]] = {}
    for part in marker.split(";"):
        where, _, spec = part.strip().partition("=")
        name, *flags = shlex.split(spec)
        if name not in SERVERS:
            raise ValueError(f"unknown server {name!r} in <!-- example: {marker} -->; known: {', '.join(SERVERS)}")
        named[int(where) if where.isdigit() else where] = (name, tuple(flags))
    return named


def shell_steps(lines: list[str]) -> list[Step]:
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip().removeprefix("$ ")
        if line.startswith("curl "):
            command = line
            while not _complete(command):
                i += 1
                command += "\n" + lines[i]
            steps.append(Step(command))
        elif steps and line and not _setup(line):
            steps[-1].expected.append(line.removeprefix("# "))
        elif steps and not line and steps[-1].expected:
            steps[-1].expected.append("")
        i += 1
    return steps


def _setup(line: str) -> bool:
    """A line the example's servers stand for: building, optimizing or serving the model, or deploying it."""
    return line.split(" ", 1)[0] in ("python", "python3", "multiverse", "infinity", "kubectl", "docker", "gcloud")


def _complete(command: str) -> bool:
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command)
    except ValueError:  # a quote still open: the command goes on on the next line
        return False
    return True


def python_steps(lines: list[str]) -> list[Step]:
    expected = [line.split("#", 1)[1].strip() for line in lines if line.lstrip().startswith("print(") and "#" in line]
    return [Step("\n".join(lines), expected)]


def collect() -> tuple[list[Example], list[str]]:
    """The marked examples, and the blocks that call a local server without a marker."""
    found, unmarked = [], []
    for page in PAGES:
        for line, marker, language, body in blocks(page.read_text(encoding="utf-8")):
            calls = any(LOCAL_URL.search(text) for text in body)
            if marker is None:
                if calls and any("curl " in text or "base_url" in text or "InferenceClient" in text for text in body):
                    unmarked.append(f"{page.relative_to(ROOT)}:{line}")
                continue
            if marker.startswith(NOT_RUN):
                continue
            if marker == ANSWER:  # the answer to the last command of the block above, shown apart
                found[-1].steps[-1].expected += [text.removeprefix("# ") for text in body]
                continue
            python = language == "python"
            steps = python_steps(body) if python else shell_steps(body)
            found.append(Example(page, line, servers_of(marker), python, steps))
    return found, unmarked


EXAMPLES, UNMARKED = collect()


def test_every_example_that_calls_a_server_is_run_or_says_why_not():
    assert not UNMARKED, f"mark each <!-- example: PORT=SERVER --> or <!-- example: not run: why -->: {UNMARKED}"
    assert all(example.steps for example in EXAMPLES), [e.id for e in EXAMPLES if not e.steps]


def tokens(text: str) -> list[tuple[str, str]]:
    found = []
    for match in TOKEN.finditer(text):
        kind, value = match.lastgroup or "mark", match.group()
        if kind == "str" and ID.fullmatch(value[1:-1]):
            kind = "id"
        elif kind == "int" and len(value.lstrip("-")) >= TIMESTAMP_DIGITS:
            kind = "timestamp"
        found.append((kind, value))
    return found


def agrees(expected: str, actual: str) -> bool:
    """Token by token; `...` in the expected text stands for any run of tokens."""
    want, have = tokens(expected), tokens(actual)

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(have)
        kind, value = want[i]
        if kind == "more":
            return any(match(i + 1, k) for k in range(j, len(have) + 1))
        if j == len(have):
            return False
        their_kind, theirs = have[j]
        if kind == "float":
            same = their_kind in ("float", "int")
        elif kind in ("id", "timestamp"):
            same = their_kind == kind
        else:
            same = (kind, value) == (their_kind, theirs)
        return same and match(i + 1, j + 1)

    return match(0, 0)


def compare(expected: list[str], actual: str, where: str) -> None:
    text = "\n".join(expected).strip()
    if text.startswith("HTTP/"):
        want_head, _, want_body = text.partition("\n\n")
        have_head, _, have_body = actual.replace("\r\n", "\n").partition("\n\n")
        want_lines, have_lines = want_head.splitlines(), have_head.splitlines()
        assert want_lines[0] == have_lines[0], f"{where}: status {have_lines[0]!r}, the page says {want_lines[0]!r}"
        have = dict(_header(line) for line in have_lines[1:])
        for name, value in (_header(line) for line in want_lines[1:]):
            assert name in have, f"{where}: no {name} header; the page shows one"
            if name in EXACT_HEADERS:
                assert have[name] == value, f"{where}: {name}: {have[name]!r}, the page says {value!r}"
        text, actual = want_body, have_body
    assert agrees(text, actual.strip()), f"{where}: the server answered\n{actual.strip()[:2000]}\nthe page says\n{text}"


def _header(line: str) -> tuple[str, str]:
    name, _, value = line.partition(":")
    return name.strip().lower(), value.strip()


@pytest.fixture(scope="module")
def servers(artifacts) -> Iterator[Callable[[str, tuple[str, ...]], int]]:
    """A server per (name, flags), started on first use and kept for the module."""
    started: dict[tuple[str, tuple[str, ...]], int] = {}
    with ExitStack() as stack:
        def port(name: str, flags: tuple[str, ...]) -> int:
            if (name, flags) not in started:
                artifact = artifacts.artifact(*SERVERS[name])
                log = artifacts.root / f"docs-{name}-{len(started)}.log"
                started[name, flags] = stack.enter_context(running(artifact, log, *flags)).port
            return started[name, flags]

        yield port


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_answers_what_the_page_shows(example: Example, servers, artifacts):
    ports = {where: servers(*server) for where, server in example.servers.items() if isinstance(where, int)}
    directories = {where: str(artifacts.artifact(*SERVERS[name])) for where, (name, _) in example.servers.items()
                   if isinstance(where, str)}

    def local(text: str) -> str:
        for where, directory in directories.items():
            text = text.replace(f'"{where}"', repr(directory))
        return LOCAL_URL.sub(lambda m: f"127.0.0.1:{ports.get(int(m.group(1)), int(m.group(1)))}", text)

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # huggingface_hub's client refuses every URL,
        env.pop(offline, None)  # loopback too, while either is set
    for step in example.steps:
        where = f"{example.id}: {step.source.splitlines()[0][:80]}"
        if example.python:
            run = subprocess.run([sys.executable, "-c", local(step.source)], capture_output=True, text=True, env=env,
                                 timeout=120, cwd=ROOT)
            assert run.returncode == 0, f"{where}: {run.stderr[-2000:]}"
            printed = run.stdout.strip().splitlines()
            assert len(printed) >= len(step.expected), f"{where}: printed {printed}"
            for want, have in zip(step.expected, printed):
                compare([want], have, where)
        else:
            run = subprocess.run(["bash", "-o", "pipefail", "-c", local(step.source)], capture_output=True, text=True,
                                 env=env, timeout=120, cwd=ROOT)
            assert run.returncode == 0, f"{where}: exit {run.returncode}: {run.stderr[-2000:]}"
            if step.expected:
                compare(step.expected, run.stdout, where)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lowercased, punctuation but hyphens dropped, spaces as hyphens."""
    found = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_links_between_the_pages_resolve():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no {path})")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no #{anchor} in {resolved.name})")
    assert not broken, broken


def _flags(parser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")}


def test_every_option_of_the_commands_is_documented():
    from infinity.cli import build_parser as serve_parser
    from optimize.cli import build_parser as optimizer_parser

    def commands(parser) -> dict:
        return next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices

    configuration = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    serve = _flags(commands(serve_parser())["serve"]) - {"--help"}
    # an on/off option's --no- flag is named once for all in the page's opening
    missing = sorted(flag for flag in serve if f"`{flag}`" not in configuration
                     and not (flag.startswith("--no-") and f"`--{flag[5:]}`" in configuration))
    assert not missing, f"docs/configuration.md does not name {missing}"
    optimizer = (ROOT / "docs" / "optimizer.md").read_text(encoding="utf-8")
    documented = re.findall(r"`(--[\w-]+)", optimizer)
    for name in ("optimize", "validate"):
        missing = sorted(_flags(commands(optimizer_parser())[name]) - {"--help"} - set(documented))
        assert not missing, f"docs/optimizer.md does not name {name}'s {missing}"
