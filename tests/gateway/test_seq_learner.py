"""Traced calls on the tiny model -> sequences -> rl_batch -> one GRPO learner step.

The calls are made as the gateway makes them: the prompt is the chat template's rendering of the
client's messages (``HFChatFormat.prompt_ids``), the response the HF backend's sampled ids with
their sampling log-probs. The merged sequence re-scored by the learner gives back those log-probs,
observation tokens are masked, and every row carries its rollout's advantage."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

import torch  # noqa: E402

from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.gateway.sequences import SequenceConfig, training_rows  # noqa: E402
from sqlrl.gateway.trace import RolloutTrace, TracedCall  # noqa: E402
from sqlrl.learn.batch import rl_batch  # noqa: E402
from sqlrl.learn.config import GRPOConfig  # noqa: E402
from sqlrl.learn.engine import Learner  # noqa: E402
from sqlrl.learn.losses import forward_logprobs  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402
from sqlrl.policy.backends import make_backend  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def setup():
    policy = load_policy(tiny_path())
    return policy, HFChatFormat(policy.tokenizer), make_backend("hf", policy)


def agent_rollout(setup, rid: str, group: str, reward: float, seed: int) -> RolloutTrace:
    """A two-call write -> rewrite conversation, as an OpenAI client agent makes it through the gateway."""
    policy, fmt, backend = setup
    messages = [{"role": "system", "content": "You write SQLite queries."},
                {"role": "user", "content": f"How many customers are there? ({rid})"}]
    calls = []
    for index, tag in enumerate(("write", "rewrite")):
        prompt = fmt.prompt_ids(messages)
        gen = backend.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=6, seed=seed + index))[0]
        calls.append(TracedCall(rollout_id=rid, index=index, tag=tag, prompt_ids=tuple(prompt),
                                response_ids=gen.token_ids, logprobs=gen.logprobs,
                                versions=(0,) * len(gen.token_ids), finish_reason=gen.finish_reason))
        # the client echoes the reply; an observation follows (the template re-renders both)
        messages += [{"role": "assistant", "content": fmt.decode(gen.token_ids)},
                     {"role": "user", "content": "Error: no such column: nme. Fix the query."}]
    return RolloutTrace(rollout_id=rid, task_id="t", group_id=group, calls=tuple(calls), status="completed",
                        reward=reward, reward_source="judge")


def test_a_learner_step_runs_on_traced_rows_and_rescoring_gives_the_sampled_logprobs(setup):
    policy, fmt, _ = setup
    traces = [agent_rollout(setup, f"r{i}", "g", reward, seed=10 * i) for i, reward in enumerate([1.0, 0.0, 0.0])]
    rows = training_rows(traces, SequenceConfig(turn_end_ids=fmt.turn_end_ids), GRPOConfig())
    assert len(rows.sequences) >= 3  # every rollout trains (merged or split -- counted either way)
    # these seeds give both: a merged sequence (its observation masked) and a re-rendered reply
    assert any(len(s.call_indices) == 2 for s in rows.sequences)
    assert any(r.mismatches.get("response_rerendered") for r in rows.rollouts)
    for r in rows.rollouts:
        assert r.n_merged + sum(r.mismatches.values()) == r.n_calls - 1
    batch = rl_batch(rows.sequences, rows.rewards, rows.group_ids, GRPOConfig(), pad_id=policy.pad_token_id,
                     advantages=rows.advantages)
    # one advantage per rollout on exactly its trained tokens, 0 elsewhere
    for i, seq in enumerate(rows.sequences):
        mask = torch.tensor(seq.loss_mask, dtype=torch.float32)
        n = len(seq.token_ids)
        assert torch.equal(batch.advantages[i, :n], mask * rows.rollout_advantage[seq.rollout_id])
        assert torch.equal(batch.input_ids[i, :n], torch.tensor(seq.token_ids))
    assert rows.rollout_advantage["r0"] > 0 > rows.rollout_advantage["r1"]
    rescore_and_step(policy, batch)


def rescore_and_step(policy, batch) -> None:
    """Re-scored by the learner's forward pass, the trained tokens get their sampled log-probs back;
    one GRPO step on the tiny model's learner changes its weights."""
    with torch.no_grad():
        logprobs, _ = forward_logprobs(policy.model.eval(), batch)
    trained = batch.loss_mask.bool()
    assert torch.allclose(logprobs[trained], batch.old_logprobs[trained], atol=2e-3)
    learner = Learner(tiny_path(), OptimConfig(lr=1e-3, total_steps=2, micro_batch_size=2))
    before = {k: v.clone() for k, v in learner.full_state_dict().items()}
    m = learner.step(batch, "grpo", GRPOConfig())
    assert m["n_tokens"] == batch.n_tokens and torch.isfinite(torch.tensor(m["loss"]))
    after = learner.full_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the weights changed


def test_rl_batch_refuses_advantages_that_do_not_match_the_rows(setup):
    policy, fmt, _ = setup
    rows = training_rows([agent_rollout(setup, "a", "g", 1.0, 1), agent_rollout(setup, "b", "g", 0.0, 2)],
                         SequenceConfig(), GRPOConfig())
    args = (rows.sequences, rows.rewards, rows.group_ids, GRPOConfig())
    with pytest.raises(ValueError, match="advantages"):
        rl_batch(*args, pad_id=policy.pad_token_id, advantages=rows.advantages[:-1])
    with pytest.raises(ValueError, match="advantages"):
        rl_batch(*args, pad_id=policy.pad_token_id, advantages=(float("nan"),) * len(rows.sequences))
