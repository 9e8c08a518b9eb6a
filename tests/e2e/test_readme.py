"""README.md stays true: every command in it is run somewhere.

- The quick ones run **here**, for real, in README order, in a scratch copy of the project (its
  own ``runs/``; ``.venv`` there is the environment running these tests; ``../shared/data`` is the
  real one when present), each with the state the README's earlier ``source``/``export`` lines set.
- The long ones (the two commands, the Ray cluster and stage jobs, ``scripts/ray_stages.sh``, the
  main job) are covered **elsewhere**: ``RULES`` names the test or script that runs each, with
  strings that file must contain to really run it, and that file must itself run in CI (a test
  under ``tests/``, which ``scripts/test.sh`` runs, or a script ``.ci/run`` reaches).
- A few cannot run here; they skip and say why (the GPU lock; hand-run benchmarks, whose scripts
  are only checked to start, with ``--help``).

What counts as a command: each line of a ```bash block (continuations joined, comments dropped),
each ```python block (one snippet; a ``print(...)  # TEXT`` line must print TEXT), and each inline
`code` span in prose that starts with a command word (python, bash, ray, uv, source, export, pip,
pytest; after VAR=value prefixes) and has an argument. A command added to the README that matches
no rule fails ``test_readme_command``; a rule that matches no command fails ``test_no_stale_rules``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(1200)  # the first Here test runs all of them (~2 min; more when loaded)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHARED_DATA = Path(os.environ.get("SQLRL_SHARED_DATA", ROOT.parent / "shared" / "data"))
COMMAND_WORDS = {"python", "python3", "bash", "sh", "ray", "uv", "source", "export", "pip", "pytest"}
TIMEOUT_S = 420  # one command on a loaded 2-core machine
TWO_COMMANDS = ["bash scripts/main.sh", "bash scripts/test.sh"]


# -- the README's commands ---------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    text: str
    kind: str  # "bash", "python", "inline", or "unlabelled:<lang>" (a fenced block to label)
    line: int  # README line number

    @property
    def id(self) -> str:
        first = self.text.splitlines()[0] if self.kind == "python" else self.text
        return f"L{self.line}:{first[:70]}"


def strip_comment(line: str) -> str:
    """The line without its shell comment (a # at the start or after a blank, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_lines(body: str) -> list[tuple[int, str]]:
    """(offset of the first line, command) for each logical line of a shell block."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for n, raw in enumerate(body.splitlines()):
        if not pending:
            start = n
        line = strip_comment(raw)
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        text = " ".join((pending + line.strip()).split())
        pending = ""
        if text:
            out.append((start, text))
    return out


def _is_command(span: str) -> bool:
    words = span.split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    return len(words) >= 2 and words[0] in COMMAND_WORDS  # `pytest` alone names a tool, not a command


def readme_commands(text: str) -> list[Command]:
    commands: list[Command] = []
    prose: list[tuple[int, str]] = []  # (offset, text) outside fenced blocks
    last = 0
    for m in re.finditer(r"^```([^\n]*)\n(.*?)^```[ \t]*$", text, re.S | re.M):
        prose.append((last, text[last:m.start()]))
        last = m.end()
        first = text.count("\n", 0, m.start()) + 2  # the block's first line
        lang, body = m.group(1).strip(), m.group(2)
        if lang == "python":
            commands.append(Command(body.rstrip("\n"), "python", first))
        elif lang in ("bash", "sh", "shell"):
            commands += [Command(cmd, "bash", first + n) for n, cmd in shell_lines(body)]
        elif lang != "text":
            commands.append(Command(body.strip(), f"unlabelled:{lang}", first))
    prose.append((last, text[last:]))
    for offset, part in prose:
        for m in re.finditer(r"`([^`]+)`", part):
            span = " ".join(m.group(1).split())
            if _is_command(span):
                commands.append(Command(span, "inline", text.count("\n", 0, offset + m.start()) + 1))
    return sorted(commands, key=lambda c: c.line)


README_TEXT = README.read_text(encoding="utf-8")
COMMANDS = readme_commands(README_TEXT)


# -- where each command runs -------------------------------------------------------------------

@dataclass(frozen=True)
class Here:
    """Run by this file, for real; ``background``: started at its turn, awaited at the end (it
    neither needs nor changes what the other commands use)."""
    background: bool = False


@dataclass(frozen=True)
class Elsewhere:
    """Run by the files in ``run_by`` (each must contain its strings and run in CI); ``does``: what
    the command's own script consists of, when its steps are what the runners cover."""
    why: str
    run_by: tuple[tuple[str, tuple[str, ...]], ...]
    does: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class NotHere:
    """Cannot run on these machines; ``help_check``: run the command with ``--help`` first."""
    reason: str
    help_check: bool = False


STAGES = ("stage1_reasoning_sft", "stage2_tooluse_sft", "stage3_reasoning_rl", "stage4_agentic_rl")
RAY_STAGES = ("scripts/ray_stages.sh", (
    "ray get-auth-token --generate", "RAY_AUTH_MODE", "ray start --head", "--node-ip-address=127.0.0.1",
    "--num-cpus=8", "--dashboard-host=127.0.0.1", " ".join(STAGES),
    "ray job submit --working-dir . -- python -m jobs.$job --config jobs/configs/$stage.yaml",
    "cluster.ray=true run_dir=", "data.synth_dir=", "ray stop"))
STAGE_JOBS_TEST = ("tests/actors/test_stage_jobs_ray.py", (
    "client.submit_job(", '"working_dir"', "cluster.ray=true run_dir=", "data.synth_dir=",
    '("stage1_reasoning_sft", "stage1")', '("stage4_agentic_rl", "stage4")'))
MAIN_TEST = ("tests/e2e/test_curriculum_main.py", ('"-m", "jobs.main"',))
CI_SETUP = (".ci/run", ("bash scripts/setup.sh",))
TRAIN_AGENT_TEST = ("tests/e2e/test_train_agent.py", ("from jobs.train_agent import run", "run_clients("))
CI_TESTS = (".ci/run", ("bash scripts/test.sh",))

RULES: list[tuple[str, Here | Elsewhere | NotHere]] = [
    # the two commands and the set-up
    (r"bash scripts/main\.sh", Elsewhere(
        "its two steps: the set-up (CI, from nothing) and the main job (tiny model, micro sizes)",
        run_by=(CI_SETUP, MAIN_TEST),
        does=(("scripts/main.sh", ("bash scripts/setup.sh", "python -m jobs.main")),))),
    (r"(SQLRL_CHAOS_ROUNDS=\d+ )?bash scripts/test\.sh( \S+)*", Elsewhere(
        "CI runs the README's test command (extra arguments only select tests)", run_by=(CI_TESTS,))),
    (r"bash scripts/setup\.sh", Elsewhere(
        "CI builds the environment with it from nothing; its error cases have a test",
        run_by=(CI_SETUP, ("tests/packaging/test_setup_script.py", ('"scripts/setup.sh"',))))),
    (r"python -m jobs\.main", Elsewhere("the main job, tiny model at micro sizes", run_by=(MAIN_TEST,))),
    (r"python -m jobs\.main --preset long --spider-eval \.\./shared/data/spider", Elsewhere(
        "the long preset (both variants, the Spider subset, the figures), tiny model at micro sizes",
        run_by=(("tests/e2e/test_curriculum_main.py", ('"--preset", "long"', '"--spider-eval"')),))),
    (r"bash scripts/dbservers\.sh start", Elsewhere(
        "the test command starts the servers with it",
        run_by=(("scripts/test.sh", ("bash scripts/dbservers.sh start",)),))),
    # a Ray cluster and the stage jobs: scripts/ray_stages.sh runs the same commands
    (r"ray start --head --node-ip-address=127\.0\.0\.1 --num-cpus=8 --dashboard-host=127\.0\.0\.1", Elsewhere(
        "scripts/ray_stages.sh starts the same head (token auth, loopback, 8 logical CPUs)", run_by=(RAY_STAGES,))),
    (r"ray job submit --working-dir \. -- python -m jobs\.(stage[1-4])_\w+ +--config jobs/configs/\1\.yaml "
     r"cluster\.ray=true run_dir=\$R/stages data\.synth_dir=\$R/data/synth", Elsewhere(
        "scripts/ray_stages.sh submits all four the same way (absolute run_dir and synth_dir, micro sizes "
        "for tiny); the Job API test submits stages 1 and 4", run_by=(RAY_STAGES, STAGE_JOBS_TEST))),
    (r"ray stop", Elsewhere("scripts/ray_stages.sh stops the cluster it started", run_by=(RAY_STAGES,))),
    # monitoring: starts Prometheus and a Ray head on fixed ports, so it runs in its own test, on free ports
    (r"bash scripts/monitor\.sh (start|stop)", Elsewhere(
        "the monitoring test runs start, a job, the page in Chromium, then stop (its own ports)",
        run_by=(("tests/e2e/test_monitoring.py", ('"scripts/monitor.sh", "start"', '"scripts/monitor.sh", "stop"',
                                                  "screenshot(")),))),
    (r"bash scripts/ray_stages\.sh \[tiny\|smollm2-135m\]", Elsewhere(
        "run with the tiny model (its default)", run_by=((".ci/run", ("bash scripts/ray_stages.sh",)),),
        does=(RAY_STAGES,))),
    # serving: a Serve app on fixed ports; the serve test deploys the same app on its own ports
    (r"serve run serve/config\.yaml", Elsewhere(
        "the serve test deploys serve.app:build_app (the file's import_path) on a real Serve; the file "
        "passes Ray's own schema", run_by=(("tests/e2e/test_serve.py", ("build_app(", "serve.run(")),
                                          ("tests/unit/test_serve_config.py", ('"serve/config.yaml"', "ServeDeploySchema"))))),
    (r"python -m jobs\.serve --model zeno=runs/main/stage4/final --database shop=sqlite:///\S+", Elsewhere(
        "tests/e2e/serve_load.py runs jobs.serve (the tiny model as zeno, a generated SQLite shop) as a Ray "
        "job in the monitoring test; the main job's test checks it prints this line for its checkpoint",
        run_by=(("tests/e2e/test_monitoring.py", ("tests/e2e/serve_load.py",)),
                ("tests/e2e/test_curriculum_main.py", ("python -m jobs.serve --model zeno=",))),
        does=(("tests/e2e/serve_load.py", ("from jobs.serve import main", '"--database"')),))),
    (r"ray job submit --working-dir \. -- python -m jobs\.serve …", Elsewhere(
        "the monitoring test submits jobs.serve (through tests/e2e/serve_load.py) with ray job submit",
        run_by=(("tests/e2e/test_monitoring.py", ("submit(env", "tests/e2e/serve_load.py")),))),
    (r"curl -s http://127\.0\.0\.1:8000/v1/(sql/generate|chat/completions) .*", Elsewhere(
        "the serve test makes the same requests over HTTP", run_by=(("tests/e2e/test_serve.py", (
            '"/v1/sql/generate"', '"/v1/chat/completions"')),))),
    # training an agent written elsewhere: the e2e test runs the job, two clients and the served checkpoint
    (r"ray job submit --working-dir \. -- python -m jobs\.train_agent --config jobs/configs/agent\.yaml ray=true",
     Elsewhere("the agent job's e2e test runs the same job (jobs.train_agent.run on the shipped config's keys; "
               "in-process, ray=false: the Ray path is not run by a test)", run_by=(TRAIN_AGENT_TEST,))),
    (r"python -m examples\.run_clients --gateway http://HOST:PORT --api-key \S+ --agent langgraph -k \d+", Elsewhere(
        "the agent job's e2e test runs two LangGraph clients with examples.run_clients against the job",
        run_by=(TRAIN_AGENT_TEST,))),
    (r"python -m jobs\.serve --model agent=runs/agent/final", Elsewhere(
        "the agent job's e2e test serves the job's checkpoint with the serving app and runs the agent on it",
        run_by=(("tests/e2e/test_train_agent.py", ("build_app(", "serve.run(", "run_agent(")),))),
    # cannot run here
    (r"uv pip sync locks/gpu\.txt", NotHere(
        "needs Linux x86-64 with an NVIDIA GPU: locks/gpu.txt is compiled here but UNVERIFIED (docs/install.md)")),
    (r"python bench/\w+\.py", NotHere(
        "hand-run benchmark (minutes; numbers depend on the machine, the docs quote one run); "
        "checked here: the script starts and parses its arguments (--help)", help_check=True)),
    # quick: run here
    (r"source \.venv/bin/activate", Here()),
    (r"source /tmp/sqlrl-dbs/env\.sh", Here()),
    (r"export [A-Z_]+=\S+( [A-Z_]+=\S+)*", Here()),
    (r"[A-Za-z_]+=\S+", Here()),
    (r"ray get-auth-token --generate > /dev/null", Here()),
    (r"bash scripts/lock\.sh", Here(background=True)),  # network-bound; writes only the copy's locks/
    (r"python -m (sqlrl\.synth|sqlrl\.db\.provisioning\.loader|jobs\.infer|jobs\.evaluate) .*", Here()),
]


def rule_for(command: Command) -> Here | Elsewhere | NotHere | None:
    if command.kind == "python":
        return Here()
    if command.kind.startswith("unlabelled"):
        return None
    for pattern, rule in RULES:
        if re.fullmatch(pattern, command.text):
            return rule
    return None


def _code_lines(text: str) -> str:
    return "\n".join(strip_comment(line) for line in text.splitlines() if not line.lstrip().startswith("#"))


def ci_reachable() -> set[str]:
    """Scripts .ci/run runs (a line ``bash scripts/x.sh …``), directly or through the scripts it runs."""
    seen: set[str] = set()
    todo = [".ci/run"]
    while todo:
        path = todo.pop()
        if path in seen or not (ROOT / path).is_file():
            continue
        seen.add(path)
        todo += re.findall(r"^\s*(?:bash|sh|source|\.)\s+(scripts/[\w.-]+\.sh)\b",
                           _code_lines((ROOT / path).read_text()), re.M)
    return seen


def check_elsewhere(rule: Elsewhere) -> list[str]:
    problems = []
    reachable = ci_reachable()
    for path, strings in rule.does + rule.run_by:
        file = ROOT / path
        if not file.is_file():
            problems.append(f"{path} does not exist")
            continue
        text = file.read_text()
        problems += [f"{path} does not contain {s!r}" for s in strings if s not in text]
    for path, _ in rule.run_by:
        if path.startswith("tests/"):
            ok = Path(path).name.startswith("test_") and "scripts/test.sh" in reachable
            if not ok:
                problems.append(f"{path} is not a test module that CI's pytest run collects")
        elif path != ".ci/run" and path not in reachable:
            problems.append(f"{path} is not run by CI: .ci/run does not reach it")
    return problems


# -- running the quick ones --------------------------------------------------------------------

@dataclass
class Result:
    rc: int | None = None
    output: str = ""
    seconds: float = 0.0
    skipped: str | None = None


def _pg_reachable(url: str) -> str | None:
    try:
        import psycopg2

        psycopg2.connect(url, connect_timeout=5).close()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable server
        return f"PostgreSQL at {url} not reachable: {str(exc).strip()[:200]}"


def _precondition(text: str, env: dict[str, str]) -> str | None:
    """Why this command cannot run here (a skip), or None."""
    if "../shared/data/spider" in text and not (SHARED_DATA / "spider" / "database").is_dir():
        return f"Spider data not found at {SHARED_DATA / 'spider'} (README commands read ../shared/data/spider)"
    if "/tmp/sqlrl-dbs/env.sh" in text and not Path("/tmp/sqlrl-dbs/env.sh").is_file():
        return "no /tmp/sqlrl-dbs/env.sh: the DB servers are not started (bash scripts/dbservers.sh start)"
    if "SQLRL_PG_ADMIN_URL" in text:
        url = env.get("SQLRL_PG_ADMIN_URL")
        return _pg_reachable(url) if url else "SQLRL_PG_ADMIN_URL is unset: no PostgreSQL server"
    return None


def _scratch(base: Path) -> Path:
    """A copy of the project (sources only) beside a ``shared/data`` link, with ``.venv`` = this env."""
    work = base / "main"
    skip_top = {".git", ".venv", ".cache", "runs"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder) == ROOT
        return {n for n in names if (top and n in skip_top) or n in {"__pycache__", ".pytest_cache"}
                or n.endswith(".egg-info") or (Path(folder) == ROOT / "bench" and n == "results")}

    shutil.copytree(ROOT, work, ignore=ignore, symlinks=True)
    (work / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    if SHARED_DATA.is_dir():
        (base / "shared").mkdir()
        (base / "shared" / "data").symlink_to(SHARED_DATA, target_is_directory=True)
    return work


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
               RAY_ADDRESS="local")  # ray.init() in a snippet starts its own instance, never joins another
    # One torch thread: on 2 shared cores two threads mostly synchronise (measured: the README's tiny
    # agentic infer, 3.5k tokens, 47 s of rollout with 2 threads vs 1.7 s with 1, at load 6-7).
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("SQLRL_TOOLS", str(ROOT / ".cache" / "tools"))  # lock.sh: the uv setup.sh installed
    env.setdefault("SQLRL_VENV", sys.prefix)
    return env


def _start_shell(script: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait(proc: subprocess.Popen, timeout_s: float = TIMEOUT_S) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the command's own process group (start_new_session)
        output, _ = proc.communicate()
        return 124, f"timed out after {timeout_s:.0f} s\n{output}"


def _run_shell(script: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    return _wait(_start_shell(script, cwd, env))


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[Command, Result]:
    """Every Here command of the README, in order, in one scratch copy; state lines carried on."""
    work = _scratch(tmp_path_factory.mktemp("readme"))
    env = _env()
    state: list[str] = []  # source/export/assignment lines that ran
    results: dict[Command, Result] = {}
    background: list[tuple[Command, subprocess.Popen, float]] = []
    for command in COMMANDS:
        rule = rule_for(command)
        if command.kind not in ("bash", "python") or not isinstance(rule, Here):
            continue
        shell_env = dict(env)
        for line in state:  # what the README's earlier lines put in the environment
            if line.startswith("source /tmp/sqlrl-dbs/env.sh"):
                shell_env.update(re.findall(r"export (\w+)=(\S+)", Path("/tmp/sqlrl-dbs/env.sh").read_text()))
        why = _precondition(command.text, shell_env)
        if why:
            if "PostgreSQL" in why and os.environ.get("SQLRL_REQUIRE_SERVERS") == "1":
                results[command] = Result(rc=1, output=why)  # scripts/test.sh: a missing server fails
            else:
                results[command] = Result(skipped=why)
            continue
        if command.kind == "python":
            snippet = work / f"readme_snippet_L{command.line}.py"
            snippet.write_text(command.text + "\n")
            body = f"python {snippet.name}"
        else:
            body = command.text
        script = "\n".join(["set -eo pipefail", *state, body])
        start = time.monotonic()
        if rule.background:
            background.append((command, _start_shell(script, work, shell_env), start))
            continue
        rc, output = _run_shell(script, work, shell_env)
        results[command] = Result(rc=rc, output=output, seconds=time.monotonic() - start)
        if rc == 0 and re.match(r"(source |export |[A-Za-z_]+=\S+$)", body):
            state.append(body)
    for command, proc, start in background:
        rc, output = _wait(proc, max(1.0, start + TIMEOUT_S - time.monotonic()))
        results[command] = Result(rc=rc, output=output, seconds=time.monotonic() - start)
    print("\nREADME commands run here (seconds):")
    for command, result in results.items():
        print(f"  {result.seconds:6.1f}  {'skip' if result.skipped else result.rc}  {command.id}")
    return results


def _expected_prints(snippet: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^\s*print\(.*\)\s+#\s*(.+)$", snippet, re.M)]


# -- the tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_readme_command(command: Command, request) -> None:
    rule = rule_for(command)
    if rule is None:
        pytest.fail(f"README line {command.line}: {command.text!r} is run by nothing. Run it here (RULES: "
                    "Here), or name the test or script that runs it (Elsewhere), in tests/e2e/test_readme.py"
                    + (" — and label the fenced block bash, python or text" if command.kind.startswith("unl") else ""))
    missing = [w for w in command.text.split() if re.fullmatch(r"[\w.-]+(/[\w.-]+)+", w)
               and not w.startswith(("runs/", "../", ".venv/")) and not (ROOT / w).exists()]
    assert not missing, f"README line {command.line}: {command.text!r} names paths that do not exist: {missing}"
    if isinstance(rule, Elsewhere):
        problems = check_elsewhere(rule)
        assert not problems, (f"README line {command.line}: {command.text!r} ({rule.why}) is not covered: "
                              + "; ".join(problems))
        return
    if isinstance(rule, NotHere):
        if rule.help_check:
            rc, output = _run_shell(f"{command.text} --help", ROOT, _env())
            assert rc == 0, f"{command.text} --help failed:\n{output[-3000:]}"
        pytest.skip(f"{command.text}: {rule.reason}")
    if command.kind == "inline":  # inline commands run where the README has them in a fenced block
        assert any(c.text == command.text and c.kind == "bash" for c in COMMANDS), (
            f"README line {command.line}: inline {command.text!r} is run only from a fenced bash block; add one")
        return
    result = request.getfixturevalue("ran")[command]
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.rc == 0, f"README line {command.line}: {command.text!r} exited {result.rc}:\n{result.output[-4000:]}"
    if command.kind == "python":
        for expected in _expected_prints(command.text):
            assert expected in result.output, (
                f"README line {command.line}: printed no {expected!r}:\n{result.output[-3000:]}")


def test_the_two_commands_section_has_exactly_two_commands() -> None:
    section = README_TEXT.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert [c.text for c in readme_commands(section) if c.kind != "inline"] == TWO_COMMANDS


def test_no_stale_rules() -> None:
    used = {pattern for pattern, _ in RULES
            if any(c.kind in ("bash", "inline") and re.fullmatch(pattern, c.text) for c in COMMANDS)}
    assert [p for p, _ in RULES if p not in used] == []


def test_the_extractor() -> None:
    text = ("Run `bash scripts/x.sh a` or `FOO=1 python -m y`, not `runs/main` or `--ray`.\n"
            "```bash\nexport A=1   # comment\npython -m z --a '#x' \\\n    --b 2  # note\n\n# only a comment\n```\n"
            "```python\nprint(1)  # 1\n```\n```text\nnot a command\n```\n")
    got = [(c.kind, c.text, c.line) for c in readme_commands(text)]
    assert got == [("inline", "bash scripts/x.sh a", 1), ("inline", "FOO=1 python -m y", 1),
                   ("bash", "export A=1", 3), ("bash", "python -m z --a '#x' --b 2", 4),
                   ("python", "print(1)  # 1", 10)]
    assert _expected_prints("print(r.rows)  # ((1,),)\nx = 1  # not a print") == ["((1,),)"]
