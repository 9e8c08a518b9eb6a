"""The tiny model's tokenizer corpus, made from the synthetic data: ``python -m sqlrl.synth.corpus``.

``sqlrl.policy.tiny`` trains its byte-level BPE tokenizer on a shipped text file
(``sqlrl/policy/tiny_corpus.jsonl.gz``, one JSON string per line). This module is what writes that
file; the policy layer only reads it, so ``sqlrl.policy`` never imports the data generator.

Content, per domain of ``CORPUS_DOMAINS`` (seeded database, ``generate_text2sql`` tasks):
- the database's CREATE TABLE text;
- per task: the question, the gold SQL, the evidence, and one tool-using conversation in the tool
  chat format of ``sqlrl.policy.chat`` -- the user turn, an ``execute_sql`` tool call, the tool
  response **as the agent shows it** (``sqlrl.tools.format_observation`` of the gold SQL's real
  result on that database: the one observation format), and the final answer.

Guarantees: deterministic (same code, same bytes: the gzip header carries no time or name);
``check()`` says whether the shipped file is what this code writes (tests/unit/test_tiny_corpus.py
runs it); the databases are built in a temporary folder and removed.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import tempfile
from pathlib import Path

from sqlrl.db import open_session
from sqlrl.policy.chat import IM_END, IM_START, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_RESPONSE_CLOSE, \
    TOOL_RESPONSE_OPEN
from sqlrl.policy.tiny import CORPUS_FILE
from sqlrl.tasks.schema import DatabaseSchema
from sqlrl.tasks.types import Text2SQLTask
from sqlrl.tools.observation import format_observation

from .domains import build_domain_db
from .text2sql import generate_text2sql

CORPUS_DOMAINS = ("library", "flights", "clinic")
TASKS_PER_DOMAIN = 150
CORPUS_PATH = CORPUS_FILE  # sqlrl/policy/tiny_corpus.jsonl.gz


def build_corpus() -> tuple[str, ...]:
    """The corpus texts, in order (empty texts dropped)."""
    texts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sqlrl-tiny-corpus-") as tmp:
        for domain in CORPUS_DOMAINS:
            path = build_domain_db(domain, os.path.join(tmp, f"{domain}.sqlite"), seed=0, scale=0.2)
            texts.append(DatabaseSchema.from_sqlite(path, db_id=domain).to_create_sql())
            with open_session(f"sqlite:///{path}") as session:
                for task in generate_text2sql(domain, path, n=TASKS_PER_DOMAIN, seed=0):
                    texts += _conversation(task, format_observation(session.execute(task.gold_sql)))
    return tuple(t for t in texts if t)


def _conversation(task: Text2SQLTask, observation: str) -> list[str]:
    call = {"name": "execute_sql", "arguments": {"sql": task.gold_sql}}
    return [task.question, task.gold_sql, task.evidence,
            f"{IM_START}user\n{task.question}{IM_END}\n",
            f"{IM_START}assistant\n{TOOL_CALL_OPEN}\n{json.dumps(call)}\n{TOOL_CALL_CLOSE}{IM_END}\n",
            f"{IM_START}user\n{TOOL_RESPONSE_OPEN}\n{observation}\n{TOOL_RESPONSE_CLOSE}{IM_END}\n",
            f"{IM_START}assistant\nThe answer is:\n```sql\n{task.gold_sql}\n```{IM_END}\n"]


def encode(texts: tuple[str, ...]) -> bytes:
    """The file's bytes: JSON lines, gzip with a fixed header (mtime 0, no file name)."""
    raw = "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts).encode()
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as f:
        f.write(raw)
    return out.getvalue()


def check(path: Path = CORPUS_PATH) -> bool:
    """True when ``path`` holds exactly what ``build_corpus`` makes now."""
    return path.is_file() and path.read_bytes() == encode(build_corpus())


def write(path: Path = CORPUS_PATH) -> Path:
    data = encode(build_corpus())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sqlrl.synth.corpus",
                                 description="write the tiny model's tokenizer corpus")
    ap.add_argument("--check", action="store_true", help="only say whether the shipped file is up to "
                                                         "date (exit 1 when not)")
    if not ap.parse_args(argv).check:
        print(f"wrote {write()}")
    elif check():
        print(f"{CORPUS_PATH}: up to date")
    else:
        print(f"{CORPUS_PATH}: out of date, run python -m sqlrl.synth.corpus", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
