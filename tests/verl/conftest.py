"""verl's own agent-loop machinery on CPU, the way verl tests itself on CPU: a real
``AgentLoopWorker`` (verl's config composed by hydra from verl's shipped YAML plus sqlrl's
agent-loop and tool YAML), a tiny real tokenizer/model folder, and a scripted LLM client in place of
the vLLM server (``ScriptedLLM``). Sessions are real sqlrl sessions.

Only the LLM server is replaced: verl's worker, config classes, tool registry, hermes tool parser,
chat-template token bookkeeping and padding all run as in training.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("verl", reason="verl is not installed (it is in the CPU lock)")

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "jobs" / "configs" / "verl"
CORPUS = ("SELECT name FROM t WHERE id = 1; CREATE TEMP TABLE x AS SELECT 1;",
          "execute_sql submit_solution tool_call arguments sql name", "You are a helpful assistant.")


def verl_config(model_dir: Path, **overrides: Any):
    """The shipped stage-4 config (``jobs/configs/verl/stage4.yaml``: verl's ``ppo_trainer`` plus
    sqlrl's agent loop, tools and reward), composed by hydra, with the test's model and changes."""
    from hydra import compose, initialize_config_dir

    sets = {"actor_rollout_ref.model.path": str(model_dir),
            "data.train_files": "unused.parquet", "data.val_files": "unused.parquet",
            "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(CONFIGS / "tools.yaml"),
            "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(CONFIGS / "agent_loop.yaml"),
            **overrides}
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("stage4", overrides=[f"{k}={_hydra_value(v)}" for k, v in sets.items()])


def _hydra_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


class ScriptedLLM:
    """The LLM server's client: ``generate`` answers from a script chosen by the marker
    ``[script:NAME]`` in the prompt, one turn per call (turn = assistant turns so far).

    A script turn is the assistant text (tool calls in hermes ``<tool_call>`` form) or ``None``:
    wait on ``self.hang`` (an ``asyncio.Event`` that is never set unless a test sets it)."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str | None]]) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.hang = asyncio.Event()
        self.prompts: list[str] = []

    async def generate(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict,
                       **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        text = self.tokenizer.decode(prompt_ids)
        self.prompts.append(text)
        name = re.search(r"\[script:(\w+)\]", text).group(1)
        turn = text.count("<|im_start|>assistant") - 1
        reply = self.scripts[name][turn]
        if reply is None:
            await self.hang.wait()
            reply = "too late"
        ids = self.tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed")


def call(name: str, sql: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"sql": sql}}) + "\n</tool_call>"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny Qwen2 folder (real tokenizer with sqlrl's tool chat template) for verl's model config."""
    from sqlrl.policy.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("verl") / "tiny", vocab_size=300, hidden_size=16,
                            heads=2, layers=1, corpus=CORPUS)


def run_worker(config: Any, llm: Any, rows: list[dict[str, Any]]) -> Any:
    """verl's ``AgentLoopWorker.generate_sequences`` on ``rows`` (verl dataset rows)."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    worker = AgentLoopWorker(config, llm)
    columns = {k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]}
    batch = DataProto.from_dict(non_tensors=columns)
    return asyncio.run(worker.generate_sequences(batch))


RowMaker = Callable[..., dict[str, Any]]
