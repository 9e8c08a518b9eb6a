"""bench/tokens.py on a byte-level tokenizer built here (no SmolLM2 cache, no network, no training):
parts sum to the rendered prompt, ``create`` costs more than ``compact``, the env var is restored,
missing data exits 2. Skips without transformers."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("transformers")

from bench.tokens import main  # noqa: E402
from sqlrl.policy.chat import IM_END, SPECIAL_TOKENS, TOOL_CHAT_TEMPLATE  # noqa: E402
from sqlrl.tasks.demo_db import build_demo_database  # noqa: E402
from sqlrl.tasks.io import write_tasks  # noqa: E402
from sqlrl.tasks.types import CriticTask, Text2SQLTask  # noqa: E402


def byte_tokenizer(out):
    """One token per byte (BPE without merges) plus the chat special tokens, saved to ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=IM_END, pad_token=SPECIAL_TOKENS[0],
                                  additional_special_tokens=list(SPECIAL_TOKENS))
    tok.chat_template = TOOL_CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    (root / "databases" / "shop").mkdir(parents=True)
    build_demo_database(str(root / "databases" / "shop" / "shop.sqlite"), seed=0)
    write_tasks(root / "text2sql_test.jsonl", [Text2SQLTask(
        task_id="t1", db_id="shop", question="How many orders were delivered?",
        gold_sql="SELECT count(*) FROM orders")])
    write_tasks(root / "critic_test.jsonl", [CriticTask(
        instance_id="c1", db_id="shop", dialect="sqlite", query="Customers per city, please.",
        issue_sql=("SELECT city FROM customers",), sol_sql=("SELECT city, count(*) FROM customers GROUP BY city",),
        test_cases=())])
    return root


def test_parts_sum_and_styles(data, tmp_path, monkeypatch):
    monkeypatch.setenv("SQLRL_SCHEMA_STYLE", "compact")
    tok = byte_tokenizer(tmp_path / "tok")
    out = tmp_path / "tokens.json"
    assert main(["--data", str(data), "--tokenizer", str(tok), "--sft", str(tmp_path / "none.jsonl"),
                 "--out", str(out)]) == 0
    assert os.environ["SQLRL_SCHEMA_STYLE"] == "compact"
    res = json.loads(out.read_text())
    assert res["tasks"] == {"text2sql": 1, "critic": 1} and "skipped" in res["observations"]
    for mode, by_style in res["prompts"].items():
        for p in by_style.values():
            assert p["total"] == pytest.approx(sum(p[k] for k in ("schema", "instructions", "tools", "user", "template")))
            assert p["template"] > 0 and (p["tools"] > 0) == (mode == "agentic")
        assert by_style["create"]["schema"] > by_style["compact"]["schema"] > 0
        assert by_style["create"]["instructions"] == by_style["compact"]["instructions"]
    shop = res["schemas"]["shop"]
    assert shop["ratio"] == pytest.approx(shop["compact"] / shop["create"]) and shop["ratio"] < 1


def test_missing_data_exits_2(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.json")]) == 2
    assert "task data not found" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
