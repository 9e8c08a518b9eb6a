"""GRPO raises the mean reward on a toy task where improvement is certain.

The whole RL update path on the tiny model: HFBackend samples 4 prompts × 8 (a GRPO group per
prompt) -> Trajectory -> reward -> ``rl_batch`` (verl GRPO advantages) -> ``Learner.step`` (verl
clipped policy loss) -> new weights into the sampler (the weight-sync path) -> sample again.
Reward: the share of generated tokens with an even id — about 0.5 for the random initial model,
reachable 1.0, and dense enough that every group has variance.
"""

from __future__ import annotations

import statistics

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

import torch  # noqa: E402

from sqlrl.agent.trajectory import Trajectory  # noqa: E402
from sqlrl.learn.batch import rl_batch  # noqa: E402
from sqlrl.learn.config import GRPOConfig  # noqa: E402
from sqlrl.learn.engine import Learner  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402
from sqlrl.policy.hf_backend import HFBackend  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402
from sqlrl.policy.types import SamplingParams  # noqa: E402


def _even_share(ids) -> float:
    return sum(1 for t in ids if t % 2 == 0) / len(ids)


@pytest.mark.slow  # trains the tiny model for many GRPO steps
def test_grpo_raises_mean_reward_on_a_certain_toy_task():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = tiny_path()
        sampler = load_policy(path)
        backend = HFBackend(sampler)
        prompts = [sampler.tokenizer.encode(f"Question {i}: say something.") for i in range(4)]
        cfg = GRPOConfig()
        learner = Learner(path, OptimConfig(lr=2e-2, total_steps=100, schedule="constant", micro_batch_size=16))
        means, versions = [], []
        for step in range(20):
            gens = backend.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=8, seed=step))
            trajs, rewards, groups = [], [], []
            for g in gens:
                p = prompts[g.meta["prompt_index"]]
                trajs.append(Trajectory(
                    task_id=str(g.meta["prompt_index"]), mode="single", messages=(),
                    token_ids=tuple(p) + g.token_ids, loss_mask=(0,) * len(p) + (1,) * len(g.token_ids),
                    old_logprobs=(0.0,) * len(p) + tuple(g.logprobs), prompt_length=len(p), turns=(),
                    n_tool_calls=0, n_tool_errors=0, n_malformed=0, submitted_sql=None,
                    stop_reason="single_turn", policy_version=learner.version))
                rewards.append(_even_share(g.token_ids))
                groups.append(str(g.meta["prompt_index"]))
            means.append(statistics.mean(rewards))
            versions.append(trajs[0].policy_version)
            learner.step(rl_batch(trajs, rewards, groups, cfg, pad_id=sampler.pad_token_id), "grpo", cfg)
            sampler.model.load_state_dict(learner.full_state_dict())  # weight sync
            backend.clear_cache()
        assert means[0] < 0.7, means  # the random model is near 0.5
        assert statistics.mean(means[-3:]) >= 0.85, means
        assert statistics.mean(means[-3:]) > means[0] + 0.25, means
        assert versions == list(range(20))  # every batch was sampled by the newest weights
    finally:
        torch.set_num_threads(threads)
