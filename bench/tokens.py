"""Where the prompt tokens go: the rendered first prompt split into its parts, per mode and schema
rendering, for the SmolLM2-135M tokenizer on the embedded default's held-out tasks.

    python bench/tokens.py [--data runs/data/synth] [--split test] [--tokenizer PATH]
                           [--sft runs/main/stage2/sft_data.jsonl] [--out FILE]

Tasks: ``<data>/{text2sql,critic}_<split>.jsonl`` (``--split test``: held-out tasks, every database;
``heldout_test``: held-out databases too) loaded with ``sqlrl.tasks.loaders.load("jsonl", ...,
db_root=<data>/databases)``, each task with its database's schema. A missing file is a clear error
and exit status 2. Tokenizer: ``smollm2_path()`` (``--tokenizer`` another checkpoint folder).

For every mode (``agentic``, ``single``) and schema style (``SCHEMA_STYLES``: ``compact``,
``create``; ``$SQLRL_SCHEMA_STYLE`` is set around each measurement and restored afterwards) the
prompt is what the agent loop starts from: ``build_messages(task, schema, mode)`` rendered by
``HFChatFormat.prompt_ids(messages, tools_for(mode))`` (chat template, generation prompt, the same
call ``AgentLoop`` makes). Its length is split into parts that **sum to it exactly**:
- ``schema``: the style's schema text alone (``SCHEMA_STYLES[style](schema, dialect)``), encoded
  without special tokens;
- ``instructions``: the system message's tokens minus ``schema`` (role, job, how to answer);
- ``tools``: the prompt with ``tools=`` minus the same prompt without (the template's tool block;
  0 in single mode);
- ``user``: the user message's tokens;
- ``template``: the rest (role markers, ``<|im_start|>``/``<|im_end|>``, the generation prompt, and
  the small boundary effects of encoding the messages separately).
Means over all tasks (and per task kind in the JSON). Per database: the schema text's tokens in each
style and the ratio compact / create.

Observations (agentic, optional): from ``--sft`` (rows with ``messages``, the SFT stage's
trajectories; skipped with a note when absent) -- per ``tool`` message its content's tokens and
the ids the loop appends for it (``HFChatFormat.continuation_ids``: end of the assistant turn,
the tool-response turn, the next generation prompt); per assistant turn its rendered tokens (the
text, tool-call JSON and ``<|im_end|>``); per trajectory its whole rendering.

Token counts only, no timing: every number is deterministic, so there are no rounds. Prints
markdown tables and writes JSON to ``bench/results/tokens.json`` (or ``--out``; with the command and
the tokenizer's name; ``bench/results/`` is gitignored).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.agent.prompts import MODES, SCHEMA_STYLES, build_messages, schema_style, tools_for  # noqa: E402
from sqlrl.tasks.types import norm_dialect  # noqa: E402

KINDS = ("text2sql", "critic")
STYLES = tuple(SCHEMA_STYLES)  # compact, create
PARTS = ("schema", "instructions", "tools", "user", "template")
ENV = "SQLRL_SCHEMA_STYLE"


@contextlib.contextmanager
def style_env(name: str) -> Iterator[None]:
    """``$SQLRL_SCHEMA_STYLE=name`` inside the block; the previous value (or its absence) after."""
    old = os.environ.get(ENV)
    os.environ[ENV] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def ntok(tok: Any, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def prompt_parts(fmt: HFChatFormat, task: Any, schema: Any, mode: str) -> dict[str, int]:
    """The first prompt's length and its parts (they sum to ``total``) under the current style."""
    tok = fmt.tokenizer
    messages = build_messages(task, schema, mode)
    tools = tools_for(mode)
    total = len(fmt.prompt_ids(messages, tools))
    bare = len(fmt.prompt_ids(messages, None)) if tools else total
    system, user = messages[0]["content"], messages[1]["content"]
    schema_n = 0
    if schema is not None and schema.tables:
        text = SCHEMA_STYLES[schema_style()](schema, norm_dialect(task.dialect))
        assert text in system, "the schema text is not in the system message"
        schema_n = ntok(tok, text)
    sys_n, user_n = ntok(tok, system), ntok(tok, user)
    return {"total": total, "schema": schema_n, "instructions": sys_n - schema_n,
            "tools": total - bare, "user": user_n, "template": bare - sys_n - user_n}


def mean_parts(rows: list[dict[str, int]]) -> dict[str, float]:
    return {k: statistics.mean(r[k] for r in rows) for k in ("total",) + PARTS} if rows else {}


def measure_prompts(fmt: HFChatFormat, tasksets: dict[str, Any]) -> dict[str, dict[str, dict]]:
    """``{mode: {style: {mean parts, "n", "by_kind": {kind: mean parts}}}}``."""
    out: dict[str, dict[str, dict]] = {}
    for mode in MODES:
        for style in STYLES:
            with style_env(style):
                by_kind = {kind: [prompt_parts(fmt, t, ts.schemas.get(t.db_id), mode) for t in ts.tasks]
                           for kind, ts in tasksets.items()}
            rows = [r for rs in by_kind.values() for r in rs]
            out.setdefault(mode, {})[style] = {**mean_parts(rows), "n": len(rows),
                                               "by_kind": {k: mean_parts(v) for k, v in by_kind.items()}}
    return out


def measure_schemas(tok: Any, tasksets: dict[str, Any]) -> dict[str, dict]:
    """Per database: the schema text's tokens in each style and compact / create."""
    dialects = {t.db_id: norm_dialect(t.dialect) for ts in tasksets.values() for t in ts.tasks}
    schemas = {db: s for ts in tasksets.values() for db, s in ts.schemas.items()}
    out = {}
    for db in sorted(schemas):
        n = {style: ntok(tok, SCHEMA_STYLES[style](schemas[db], dialects.get(db, "sqlite"))) for style in STYLES}
        out[db] = {**n, "tables": len(schemas[db].tables), "ratio": n["compact"] / n["create"]}
    return out


def measure_observations(fmt: HFChatFormat, path: Path, sample: Any = None) -> dict[str, Any]:
    """Tool-message and assistant-turn tokens in SFT trajectories (``{"skipped": why}`` without)."""
    if not path.is_file():
        return {"skipped": f"{path} not found (run the main job's stage 2 to write it)"}
    tok = fmt.tokenizer
    content, appended, assistant, whole, prompt = [], [], [], [], []
    for line in path.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        msgs, tools = row.get("messages") or [], row.get("tools")
        if not msgs:
            continue
        whole.append(len(fmt._render(msgs, tools, False)))  # HFChatFormat's own rendering call
        first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), len(msgs))
        prompt.append(len(fmt.prompt_ids(msgs[:first], tools)))
        for i, m in enumerate(msgs):
            if m["role"] == "tool":
                content.append(ntok(tok, str(m.get("content", ""))))
            if m["role"] != "assistant":
                continue
            assistant.append(len(fmt._render(msgs[:i + 1], tools, False)) - len(fmt.prompt_ids(msgs[:i], tools)))
            j = i + 1
            while j < len(msgs) and msgs[j]["role"] == "tool":
                j += 1
            if j > i + 1:  # all tool responses of one turn together, as the loop appends them
                appended.append(len(fmt.continuation_ids(msgs[:i + 1], msgs[i + 1:j], tools)) / (j - i - 1))
    text = path.read_text()
    style = next((s for s in STYLES if header(s, sample) in text), "unknown") if sample else "unknown"

    def stats(xs: list) -> dict:
        return {"n": len(xs), "mean": statistics.mean(xs), "max": max(xs)} if xs else {"n": 0}

    return {"file": str(path), "schema_style": style, "tool_content": stats(content),
            "tool_appended": stats(appended), "assistant_turn": stats(assistant),
            "first_prompt": stats(prompt), "trajectory": stats(whole)}


def header(style: str, schema: Any) -> str:
    """``style``'s fixed words after the database name (`` has this schema:``): tells the style."""
    text = SCHEMA_STYLES[style](schema, "sqlite")
    return text.split(f"`{schema.db_id}`", 1)[1].split("\n", 1)[0]


def tables(res: dict) -> str:
    lines = ["| mode | style | n | total | schema | instructions | tools | user | template | schema % |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, by_style in res["prompts"].items():
        for style, p in by_style.items():
            lines.append(f"| {mode} | {style} | {p['n']} | {p['total']:.1f} | "
                         + " | ".join(f"{p[k]:.1f}" for k in PARTS) + f" | {100 * p['schema'] / p['total']:.0f}% |")
    lines += ["", "| database | tables | create | compact | compact / create |", "|---|---|---|---|---|"]
    for db, s in res["schemas"].items():
        lines.append(f"| {db} | {s['tables']} | {s['create']} | {s['compact']} | {s['ratio']:.2f} |")
    obs = res["observations"]
    if "skipped" in obs:
        lines += ["", f"observations: skipped -- {obs['skipped']}"]
    else:
        lines += ["", f"observations ({obs['file']}, prompts in the {obs['schema_style']} style):",
                  "| part | n | mean tokens | max |", "|---|---|---|---|"]
        for key in ("tool_content", "tool_appended", "assistant_turn", "first_prompt", "trajectory"):
            s = obs[key]
            lines.append(f"| {key} | {s['n']} | {s.get('mean', 0):.1f} | {s.get('max', 0):g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT / "runs" / "data" / "synth"))
    ap.add_argument("--split", default="test", help="test (held-out tasks) or heldout_test (held-out databases)")
    ap.add_argument("--tokenizer", default=None, help="a checkpoint folder (default: smollm2_path())")
    ap.add_argument("--sft", default=str(ROOT / "runs" / "main" / "stage2" / "sft_data.jsonl"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tokens.json"))
    a = ap.parse_args(argv)
    root = Path(a.data)
    files = {kind: root / f"{kind}_{a.split}.jsonl" for kind in KINDS}
    missing = [str(p) for p in [*files.values(), root / "databases"] if not p.exists()]
    if missing:
        print(f"error: task data not found: {', '.join(missing)}\n"
              f"generate it with: python -m sqlrl.synth --out {root} --n-per-domain 60", file=sys.stderr)
        return 2

    from transformers import AutoTokenizer

    from sqlrl.tasks.loaders import load

    if a.tokenizer:
        path, name = Path(a.tokenizer), Path(a.tokenizer).name
    else:
        from sqlrl.policy.smollm import smollm2_path
        path = smollm2_path()
        name = f"SmolLM2-135M-Instruct ({path.name})"
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    fmt = HFChatFormat(tok)
    tasksets = {kind: load("jsonl", f, db_root=root / "databases") for kind, f in files.items()}
    sample = next((s for ts in tasksets.values() for s in ts.schemas.values()), None)
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None
           else " ".join(["python", "bench/tokens.py", *argv]),
           "tokenizer": name, "tokenizer_path": str(path), "data": str(root), "split": a.split,
           "tasks": {k: len(ts.tasks) for k, ts in tasksets.items()},
           "skipped": {k: ts.skipped for k, ts in tasksets.items() if ts.skipped},
           "default_style": schema_style(), "timing": "none: token counts are deterministic, no rounds",
           "prompts": measure_prompts(fmt, tasksets), "schemas": measure_schemas(tok, tasksets),
           "observations": measure_observations(fmt, Path(a.sft), sample)}
    print(f"tokenizer: {name}; tasks: {res['tasks']} ({a.split}); mean tokens per first prompt\n")
    print(tables(res))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
