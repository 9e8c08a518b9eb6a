"""The loop with the real tiny policy tokenizer (``sqlrl.policy.tiny``, BPE, the policy's tool chat
template) through ``HFChatFormat``, a scripted backend emitting real token ids, and a real SQLite
session. Builds the tiny checkpoint once (about 10 s on 2 cores); skips without transformers."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers import AutoTokenizer  # noqa: E402

from sqlrl.agent import AgentLoop, HFChatFormat, LoopConfig, build_messages, tools_for  # noqa: E402
from sqlrl.db import open_session  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402
from tests.unit.test_agent_loop import ScriptedBackend, task, tc  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from sqlrl.policy.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def test_loop_with_the_tiny_tokenizer_gives_the_templates_own_ids(tokenizer, demo_db_path):
    fmt = HFChatFormat(tokenizer)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert fmt.end_of_turn == "<|im_end|>" and fmt.turn_end_ids == (eot,)
    schema = DatabaseSchema.from_sqlite(demo_db_path)
    scripts = {"Q-tiny": ["no call here",
                          tc("SELECT city, count(*) FROM customers GROUP BY city ORDER BY 2 DESC LIMIT 3"),
                          ("stop", tc("SELECT nope FROM orders")),
                          tc("SELECT count(*) FROM customers", "submit_solution")]}
    backend = ScriptedBackend(tokenizer, scripts, eot_id=eot)
    cfg = LoopConfig(max_turns=6, max_total_tokens=30000, sampling=SamplingParams(max_new_tokens=300))
    with open_session(f"sqlite:///{demo_db_path}") as session:
        (t,) = AgentLoop([task("Q-tiny")], [session], backend, fmt, cfg, schemas={"shop": schema}).run()
    assert t.stop_reason == "submitted" and (t.n_malformed, t.n_tool_calls, t.n_tool_errors) == (1, 3, 1)
    tools = tools_for("agentic")
    prompt = tokenizer.apply_chat_template(build_messages(task("Q-tiny"), schema), tools=tools,
                                           add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    assert list(t.token_ids[:t.prompt_length]) == list(prompt)
    gens = [out[0] for out in backend.outputs]
    masked = [i for i, m in zip(t.token_ids, t.loss_mask) if m]
    assert masked == [i for g in gens for i in g.token_ids]
    assert [lp for lp, m in zip(t.old_logprobs, t.loss_mask) if m] == [x for g in gens for x in g.logprobs]
    # Decoded, the ids are the template's rendering of the messages (the turn cut at </tool_call>
    # was closed with <|im_end|> by the continuation; the last turn stops at <|im_end|>).
    rendered = tokenizer.apply_chat_template(list(t.messages), tools=tools, tokenize=False)
    assert t.render(fmt) + "\n" == rendered
