"""Every command block of README.md and of the docs site's pages runs as written, in a fresh venv
made from the checkout.

The ```bash, ```sh and ```console blocks (of a console block, its `$ ` lines) are taken from the
README, then from the pages of docs/ in the site's order (mkdocs.yml `nav`), each in order. Each
command line runs in bash, in one working directory for the session: a copy
of the checkout, so `pip install -e .` installs it and what one block writes (the demo's records)
is there for the next. One venv is made for the session from that copy; its `bin` comes first on
PATH and no OTEL_/RAGTOLL_/OPENAI_ variable is inherited. What a command talks to is real and on
loopback, at free ports written over the README's: `localhost:8787` is `ragtoll serve` from that
venv in front of a fake OpenAI-compatible upstream, `localhost:4318` an OTLP/HTTP receiver that
decodes the protobuf; `agent.py` is tests/docs/standin_agent.py.

* A line whose last command is `ragtoll serve` must answer /readyz, then stop on Ctrl-C with 0.
* An `opentelemetry-instrument` line that sets an OTLP endpoint must deliver the agent's spans to
  the receiver, joined to ragtoll's, and each task named by baggage must have one trace root.
* A `pip install` line must also resolve in an empty venv (`--dry-run`): the agent's venv has no
  ragtoll yet, and a name that resolves only because an earlier line installed the checkout
  (`ragtoll[agent]`) is not on any index.
* `helm install|upgrade` lines are rendered in-process (helm-python-sdk, the chart's schema
  applies) and every object validated against the newest schema kubernetes-validate bundles.
* `docker` and `kubectl` lines cannot run here: only in the blocks NOT_RUNNABLE lists, with why.
* The README's test command is this suite: .ci/run runs it (checked below), not this test.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import helm_python as helm
import httpx
import kubernetes_validate.utils as kv
import pytest
import yaml
from readme_blocks import Block, Command, readme_blocks
from support.otlp import OtlpReceiver
from support.servers import free_port, serve_in_thread
from support.upstream import UpstreamApp

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MKDOCS = ROOT / "mkdocs.yml"
CI_RUN = ROOT / ".ci" / "run"
AGENT = Path(__file__).with_name("standin_agent.py")
TEST_COMMAND = "pip install -e '.[test]' && python -m pytest -q -p no:cacheprovider"
CANNOT_RUN = ("docker", "kubectl")
_NO_CLUSTER = ("kubectl: no Kubernetes cluster here; the helm line is rendered, and what port-forward "
               "names must be in the rendering")
# Blocks with `docker`/`kubectl` lines, keyed by the block's first line, and why those lines do not
# run here. Their other lines run. Every other block runs whole.
NOT_RUNNABLE = {
    "docker run --rm --name jaeger -p 16686:16686 -p 4317:4317 -p 4318:4318 jaegertracing/jaeger:latest":
        "docker: no Docker engine here; the `ragtoll serve` line runs, exporting to the OTLP receiver",
    'kubectl create secret generic ragtoll-admin --from-literal=token="$(openssl rand -hex 24)"': _NO_CLUSTER,
    "helm upgrade my-agent ./helm/ragtoll --reuse-values --set jaeger.enabled=true": _NO_CLUSTER,
    "docker build -t registry.example.com/acme/ragtoll:0.1.0 .":
        "docker: no Docker engine here; .github/workflows/image.yml builds the same Dockerfile in CI",
}
ADMIN = "readme-admin-token"
SPAN_KIND_SERVER, SPAN_KIND_CLIENT = 2, 3
_COPY_IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", ".pytest_cache",
                                      ".hypothesis", ".mypy_cache", ".ruff_cache", "build", "dist")
T = TypeVar("T")


def _is_test_command(command: Command) -> bool:
    return command.words() == Command(0, TEST_COMMAND).words()


def _nav_pages(nav: list[Any]) -> list[str]:
    pages: list[str] = []
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


# README first, then the site's pages in its order: a page may use what an earlier one wrote
PAGES = [README, *(ROOT / "docs" / page for page in _nav_pages(yaml.safe_load(MKDOCS.read_text())["nav"]))]
BLOCKS = [(page.relative_to(ROOT).as_posix(), block) for page in PAGES for block in readme_blocks(page.read_text())]


def test_every_page_of_the_site_is_in_its_nav() -> None:
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert on_disk - {p.relative_to(ROOT).as_posix() for p in PAGES} == set(), "a page is not in mkdocs.yml nav"


def test_every_block_runs_or_is_listed_with_the_reason() -> None:
    firsts = [b.first for _, b in BLOCKS]
    assert len(set(firsts)) == len(firsts), "two blocks start with the same line, which NOT_RUNNABLE keys on"
    gone = sorted(set(NOT_RUNNABLE) - set(firsts))
    assert not gone, f"NOT_RUNNABLE lists blocks the README no longer has; take them off: {gone}"
    for page, block in BLOCKS:
        cannot = {argv[0] for c in block.commands for argv in c.argvs()} & set(CANNOT_RUN)
        if block.first in NOT_RUNNABLE:
            assert cannot, f"{page}:{block.line}: in NOT_RUNNABLE, but every line of it runs: take it off"
        else:
            assert not cannot, (f"{page}:{block.line}: runs {sorted(cannot)}, which cannot run here: list "
                                f"{block.first!r} in NOT_RUNNABLE with the reason")
    assert sum(_is_test_command(c) for _, b in BLOCKS[:len(readme_blocks(README.read_text()))]
               for c in b.commands) == 1, (
        f"the README's test command is not `{TEST_COMMAND}`: update TEST_COMMAND and .ci/run together")


def test_blocks_are_read_as_bash_reads_them() -> None:
    lines = ["```bash", "# a comment", "A=1 B='two words' tool run \\", "  --flag x && other   # note", "```",
             "```console", "$ ragtoll demo --quick", "output line", "$ ragtoll report r.jsonl", "```",
             "```yaml", "key: value", "```"]
    page = "\n".join(lines)
    bash, console = readme_blocks(page)
    assert (bash.line, bash.first, [c.line for c in bash.commands]) == (1, "# a comment", [3])
    (command,) = bash.commands
    assert command.env() == {"A": "1", "B": "two words"}
    assert command.argvs() == [["tool", "run", "--flag", "x"], ["other"]]
    assert [c.text for c in console.commands] == ["ragtoll demo --quick", "ragtoll report r.jsonl"]


def test_ci_runs_the_readme_test_command() -> None:
    # .ci/run installs quietly; otherwise it is the README's line
    lines = [re.sub(r"^pip install -q ", "pip install ", line.strip())
             for line in CI_RUN.read_text().splitlines()]
    assert TEST_COMMAND in lines


# --- running the blocks -------------------------------------------------------------------------


@dataclass
class Reader:
    """A reader's machine: the checkout, its venv, and the services the README assumes."""

    work: Path  # the copy of the checkout every command runs in
    venv: Path
    bare: Path  # an empty venv: install lines must resolve there too
    env: dict[str, str]
    otlp: OtlpReceiver
    ports: dict[str, str]  # the README's port -> the stand-in's
    ragtoll_url: str  # the stand-in `ragtoll serve` behind localhost:8787
    demo_hint: subprocess.CompletedProcess[str]  # `ragtoll demo` before the demo extra is installed
    releases: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=dict)

    def substitute(self, text: str) -> str:
        return re.sub(r"\b(localhost|127\.0\.0\.1):(8787|4318)\b",
                      lambda m: f"{m[1]}:{self.ports[m[2]]}", text)

    def spans(self) -> list[dict[str, Any]]:
        with self.otlp.lock:
            return list(self.otlp.spans)


def _reader_env(venv: Path) -> dict[str, str]:
    own_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "RAGTOLL_", "OPENAI_", "PYTEST_"))
           and k not in ("TRACEPARENT", "TRACESTATE", "BAGGAGE", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != own_bin]
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), VIRTUAL_ENV=str(venv))
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 900,
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _wait_for(probe: Callable[[], T], timeout: float = 15) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _start(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A service in a process group of its own (so Ctrl-C reaches every process the line starts)."""
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before answering {url}/readyz:\n{_tail(log.read_text())}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"no answer on {url}/readyz in {timeout:.0f} s:\n{_tail(log.read_text())}")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """Ctrl-C to the process group it leads, as a terminal sends it; its exit status."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:  # still running after 30 s: the test fails on the status anyway
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    tmp = tmp_path_factory.mktemp("readme")
    work = tmp / "ragtoll"
    shutil.copytree(ROOT, work, symlinks=True, ignore=_COPY_IGNORE)
    shutil.copy(AGENT, work / "agent.py")
    venv, bare = tmp / "venv", tmp / "bare"
    for path in (venv, bare):
        made = _run([sys.executable, "-m", "venv", str(path)], tmp, dict(os.environ))
        assert made.returncode == 0, made.stderr
    env = _reader_env(venv)
    installed = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(work)], work, env)
    assert installed.returncode == 0, _tail(installed.stderr)
    # the demo's install hint, while the venv has only what `pip install -e .` brings
    demo_hint = _run([str(venv / "bin" / "ragtoll"), "demo", "--quick"], work, env, timeout=120)
    receiver, upstream = OtlpReceiver(), UpstreamApp()
    with serve_in_thread(receiver) as otlp_url, serve_in_thread(upstream) as upstream_url:
        standin = {
            "server": {"host": "127.0.0.1", "port": free_port()},
            "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream_url,
                           "prefix": "/openai"}],
            "budgets": {"default_profile": "bounded", "records_file": str(tmp / "standin-tasks.jsonl"),
                        "profiles": {"bounded": {"max_steps": 8}, "tight": {"max_steps": 6}}},
        }
        config = tmp / "standin.yaml"
        config.write_text(yaml.safe_dump(standin))
        log = tmp / "standin.log"
        standin_env = {**env, "RAGTOLL_ADMIN_TOKEN": ADMIN, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url,
                       "OTEL_SERVICE_NAME": "ragtoll", "OTEL_METRICS_EXPORTER": "none"}
        proc = _start([str(venv / "bin" / "ragtoll"), "serve", "--config", str(config)], tmp, standin_env,
                      log)
        try:
            ragtoll_url = f"http://127.0.0.1:{standin['server']['port']}"
            _wait_ready(ragtoll_url, proc, log, timeout=60)
            ports = {"8787": str(standin["server"]["port"]), "4318": otlp_url.rsplit(":", 1)[1]}
            yield Reader(work, venv, bare, env, receiver, ports, ragtoll_url, demo_hint)
        finally:
            _stop(proc)


@pytest.mark.slow
def test_the_demos_install_hint_installs_from_the_checkout(reader: Reader) -> None:
    hint = reader.demo_hint
    assert hint.returncode == 2 and "the demo needs the demo extra" in hint.stderr, hint.stderr
    line = re.search(r"pip install .*$", hint.stderr, re.MULTILINE)  # the hint ends with the command
    assert line is not None, hint.stderr
    _resolves_in_an_empty_venv(reader, Command(0, line.group(0)).argvs()[0], "the demo's install hint")


@pytest.mark.slow
@pytest.mark.parametrize(("page", "block"), BLOCKS, ids=[f"{p}:L{b.line}:{b.first[:40].strip()}" for p, b in BLOCKS])
def test_block_runs_as_written(page: str, block: Block, reader: Reader) -> None:
    for command in block.commands:
        argvs = command.argvs()
        programs = {argv[0] for argv in argvs}
        where = f"{page}:{command.line}: `{command.text}`"
        if _is_test_command(command):
            continue  # this suite: .ci/run runs it (test_ci_runs_the_readme_test_command)
        assert not any("pytest" in argv[:3] for argv in argvs), f"{where} would run the suite inside itself"
        if programs & set(CANNOT_RUN):
            assert block.first in NOT_RUNNABLE, f"{where} cannot run here; list its block in NOT_RUNNABLE"
            for argv in argvs:
                _check_port_forward(argv, reader, where)
            continue
        if argvs[0][0] == "helm":
            assert len(argvs) == 1, f"{where}: a helm line is rendered in-process, so it must be helm alone"
            _render_helm(argvs[0], reader, where)
            continue
        for argv in argvs:
            if argv[:2] == ["pip", "install"]:
                _resolves_in_an_empty_venv(reader, argv, where)
        text = reader.substitute(command.text)
        if argvs[-1][:2] == ["ragtoll", "serve"]:
            _run_service(reader, text, where)
            continue
        seen = len(reader.spans())
        done = _run(["bash", "-c", text], reader.work, reader.env)
        assert done.returncode == 0, (f"{where} exited {done.returncode}:\n"
                                      f"{_tail(done.stdout)}\n{_tail(done.stderr)}")
        if "opentelemetry-instrument" in programs and "OTEL_EXPORTER_OTLP_ENDPOINT" in command.env():
            _check_agent_trace(reader, command, seen, where, done.stderr)


def _resolves_in_an_empty_venv(reader: Reader, argv: list[str], where: str) -> None:
    args = [a for a in argv[2:] if a not in ("-q", "--quiet")]
    done = _run([str(reader.bare / "bin" / "python"), "-m", "pip", "install", "--dry-run", "-q", *args],
                reader.work, reader.env)
    assert done.returncode == 0, (f"{where}: `pip install {shlex.join(args)}` does not install into a venv "
                                  f"without ragtoll:\n{_tail(done.stderr, 6)}")


def _run_service(reader: Reader, text: str, where: str) -> None:
    """Start the line, wait for /readyz, Ctrl-C it: it must stop with status 0."""
    port = free_port()
    log = reader.work.parent / f"service-{port}.log"
    proc = _start(["bash", "-c", text], reader.work, {**reader.env, "RAGTOLL_SERVER__PORT": str(port)}, log)
    try:
        _wait_ready(f"http://127.0.0.1:{port}", proc, log, timeout=600)  # a pip install may come first
    finally:
        code = _stop(proc)
    assert code == 0, f"{where}: exited {code} on Ctrl-C:\n{_tail(log.read_text())}"


def _check_agent_trace(reader: Reader, command: Command, seen: int, where: str, stderr: str) -> None:
    """The agent's spans reached the receiver, ragtoll's server spans are their children, and each
    task named by baggage is one trace with one root (ragtoll's `ragtoll.task`, once the task ends)."""
    service = command.env().get("OTEL_SERVICE_NAME", "unknown_service")

    def agent_spans() -> list[dict[str, Any]]:
        return [s for s in reader.spans()[seen:] if s["resource"].get("service.name") == service]

    agent = _wait_for(agent_spans)
    assert agent, f"{where}: none of the agent's spans reached the OTLP/HTTP receiver:\n{_tail(stderr, 12)}"
    clients = {s["span_id"] for s in agent if s["kind"] == SPAN_KIND_CLIENT}
    traces = {s["trace_id"] for s in agent}

    def ragtoll_spans() -> list[dict[str, Any]]:
        return [s for s in reader.spans()
                if s["trace_id"] in traces and s["resource"].get("service.name") == "ragtoll"]

    def joined() -> bool:
        servers = {s["parent_span_id"] for s in ragtoll_spans() if s["kind"] == SPAN_KIND_SERVER}
        return bool(clients) and clients <= servers

    assert _wait_for(joined), f"{where}: ragtoll's server spans are not children of the agent's HTTP spans"
    named = {s["attributes"]["ragtoll.task.id"] for s in ragtoll_spans()
             if s["attributes"].get("ragtoll.task.source") == "baggage"}
    for task in sorted(named):
        ended = httpx.post(f"{reader.ragtoll_url}/admin/tasks/{task}/end",
                           headers={"authorization": f"Bearer {ADMIN}"})
        assert ended.status_code == 200, ended.text

        def summary(task: str = task) -> list[dict[str, Any]]:
            return [s for s in reader.spans()
                    if s["name"] == "ragtoll.task" and s["attributes"].get("ragtoll.task.id") == task]

        found = _wait_for(summary)
        assert len(found) == 1, f"{where}: {len(found)} ragtoll.task spans for task {task} after it ended"
        task_span = found[0]
        trace = [s for s in reader.spans() if s["trace_id"] == task_span["trace_id"]]
        ids = {s["span_id"] for s in trace}
        roots = [f"{s['name']} [{s['resource'].get('service.name')}]"
                 for s in trace if s["parent_span_id"] not in ids]
        assert roots == ["ragtoll.task [ragtoll]"], f"{where}: task {task}'s trace has roots {roots}"


def _render_helm(argv: list[str], reader: Reader, where: str) -> None:
    """`helm install|upgrade NAME CHART [--set k=v]... [--reuse-values]`, rendered as Helm would."""
    if len(argv) < 4 or argv[1] not in ("install", "upgrade"):
        pytest.fail(f"{where}: only `helm install|upgrade NAME CHART [--set k=v] [--reuse-values]` renders")
    action, name, chart, flags = argv[1], argv[2], argv[3], argv[4:]
    values: dict[str, Any] = {}
    reuse = False
    while flags:
        flag = flags.pop(0)
        if flag == "--set" and flags:
            _merge(values, helm.parse_set_string(flags.pop(0)))
        elif flag.startswith("--set="):
            _merge(values, helm.parse_set_string(flag.removeprefix("--set=")))
        elif flag == "--reuse-values":
            reuse = True
        else:
            pytest.fail(f"{where}: helm flag {flag} is not rendered by tests/docs/test_readme.py: add it")
    if action == "upgrade":
        assert name in reader.releases, f"{where}: no `helm install {name}` ran before it (deselected?)"
        if reuse:
            values = _merge(copy.deepcopy(reader.releases[name][0]), values)
    else:
        assert name not in reader.releases, f"{where}: release {name} is installed twice"
    rendered = helm.Chart.load(reader.work / chart).render(values, name=name, namespace="default",
                                                           is_install=action == "install",
                                                           is_upgrade=action == "upgrade")
    docs = [d for path in sorted(rendered) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(rendered[path]) if d]
    problems: list[str] = []
    for doc in docs:
        try:
            kv.validate(doc, kv.latest_version(), strict=True)
        except kv.ValidationError as exc:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert problems == [], f"{where}: {problems}"
    reader.releases[name] = (values, docs)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


_KINDS = {"deploy": "Deployment", "deployment": "Deployment", "svc": "Service", "service": "Service"}


def _check_port_forward(argv: list[str], reader: Reader, where: str) -> None:
    """A `kubectl port-forward KIND/NAME` line does not run, but what it names must be rendered."""
    if argv[:2] != ["kubectl", "port-forward"]:
        return
    kind, _, name = argv[2].partition("/")
    rendered = {(d["kind"], d["metadata"]["name"]) for _, docs in reader.releases.values() for d in docs}
    assert (_KINDS.get(kind, kind), name) in rendered, f"{where}: the README's helm lines render no {argv[2]}"
