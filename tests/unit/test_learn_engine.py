"""The training engine on the tiny model, in-process: SFT learns, micro-batching and gradient
accumulation give the full-batch gradient, the LR schedule, clipping, reference/KL, bad input."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

import torch  # noqa: E402

from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.learn.batch import SFTExample, TokenBatch, sft_batch  # noqa: E402
from sqlrl.learn.config import GRPOConfig, SFTConfig  # noqa: E402
from sqlrl.learn.engine import Learner  # noqa: E402
from sqlrl.learn.losses import LOSSES  # noqa: E402
from sqlrl.learn.optim import OptimConfig, build_optimizer, build_scheduler, lr_factor  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402

QUESTIONS = ["How many customers are there?", "List every product name.", "What is the largest order?",
             "Which city has most customers?", "Count the orders of 2024.", "Show the cheapest product."]
ANSWERS = ["SELECT COUNT(*) FROM customers", "SELECT name FROM products", "SELECT MAX(total) FROM orders",
           "SELECT city FROM customers GROUP BY city ORDER BY COUNT(*) DESC LIMIT 1",
           "SELECT COUNT(*) FROM orders WHERE year = 2024", "SELECT name FROM products ORDER BY price LIMIT 1"]


def examples(n: int = 6) -> list[SFTExample]:
    return [SFTExample(messages=({"role": "system", "content": "Write SQL."}, {"role": "user", "content": q},
                                 {"role": "assistant", "content": a}))
            for q, a in list(zip(QUESTIONS, ANSWERS))[:n]]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_path()


@pytest.fixture(scope="module")
def batch(tiny) -> TokenBatch:
    policy = load_policy(tiny)
    return sft_batch(examples(), HFChatFormat(policy.tokenizer), max_length=256, pad_id=policy.pad_token_id)


def test_sft_loss_falls_on_a_few_chat_examples(tiny, batch) -> None:
    learner = Learner(tiny, OptimConfig(lr=3e-3, warmup_steps=2, total_steps=20, micro_batch_size=4))
    losses = [learner.step(batch, "sft", SFTConfig())["loss"] for _ in range(20)]
    assert losses[-1] < 0.3 * losses[0], losses
    assert learner.version == 20


def full_batch_gradient_norm(tiny, batch) -> tuple[float, float]:
    """Reference: one backward over the whole batch, no micro-batching."""
    model = load_policy(tiny).model.train()
    out = LOSSES["sft"](model, batch, SFTConfig())
    out.loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
    return float(out.loss.detach()), float(norm)


def test_micro_batches_give_the_full_batch_update(tiny, batch) -> None:
    loss, norm = full_batch_gradient_norm(tiny, batch)
    results = []
    for size in (1, 4, 6):
        learner = Learner(tiny, OptimConfig(lr=1e-3, total_steps=10, micro_batch_size=size, grad_clip=None))
        m = learner.step(batch, "sft", SFTConfig())
        assert m["micro_batches"] == math.ceil(len(batch) / size)
        assert m["loss"] == pytest.approx(loss, rel=1e-5)
        assert m["grad_norm"] == pytest.approx(norm, rel=1e-4)
        assert m["n_tokens"] == m["tokens"] == batch.n_tokens
        results.append(learner.full_state_dict())
    for other in results[1:]:
        for key, value in results[0].items():
            torch.testing.assert_close(other[key], value, rtol=1e-4, atol=2e-5)


def test_schedule_warmup_cosine_and_floor() -> None:
    cfg = OptimConfig(lr=1.0, warmup_steps=3, total_steps=13, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_factor(s, cfg) for s in range(3)] == pytest.approx([0.25, 0.5, 0.75])
    assert lr_factor(3, cfg) == pytest.approx(1.0)
    assert lr_factor(8, cfg) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(13, cfg) == lr_factor(100, cfg) == pytest.approx(0.1)
    linear = OptimConfig(lr=1.0, total_steps=4, schedule="linear")
    assert [lr_factor(s, linear) for s in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    assert lr_factor(7, OptimConfig(lr=1.0, schedule="constant")) == 1.0
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], OptimConfig(lr=0.5, warmup_steps=1))
    sched = build_scheduler(opt, OptimConfig(lr=0.5, warmup_steps=1))
    assert sched.get_last_lr() == [0.25]


def test_lr_and_clipping_in_step_metrics(tiny, batch) -> None:
    learner = Learner(tiny, OptimConfig(lr=1e-3, warmup_steps=1, total_steps=4, schedule="linear",
                                        grad_clip=1e-3, micro_batch_size=6))
    before = {k: v.clone() for k, v in learner.full_state_dict().items()}
    first, second = (learner.step(batch, "sft", SFTConfig()) for _ in range(2))
    assert first["lr"] == pytest.approx(5e-4) and second["lr"] == pytest.approx(1e-3)
    assert first["grad_norm"] > 1e-3  # reported before clipping
    # Adam's first update is lr * sign-like (clipping rescales g and sqrt(v) alike): the step still moves
    after = learner.full_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_every_step_hands_its_freed_heap_back(tiny, batch, monkeypatch) -> None:
    import sqlrl.learn.engine as engine

    trims = []
    monkeypatch.setattr(engine, "trim_heap", lambda: trims.append(1) or True)
    learner = Learner(tiny, OptimConfig(lr=1e-3, micro_batch_size=3))
    for _ in range(2):
        learner.step(batch, "sft", SFTConfig())
    assert len(trims) == 2  # once a step, after the update (sqlrl.memory.trim; tests/unit/test_memory.py)


def test_bf16_autocast_step_is_finite(tiny, batch) -> None:
    learner = Learner(tiny, OptimConfig(lr=1e-3, micro_batch_size=6), mixed_precision="bf16")
    m = learner.step(batch, "sft", SFTConfig())
    assert math.isfinite(m["loss"]) and m["skipped"] == 0.0
    assert next(learner.model.parameters()).dtype == torch.float32  # master weights stay fp32


@pytest.mark.parametrize("hardware", [True, False])
def test_bf16_on_a_cpu_without_bf16_hardware_warns(monkeypatch, hardware) -> None:
    import warnings

    from sqlrl.learn import fsdp

    monkeypatch.setattr(fsdp, "cpu_bf16_hardware", lambda: hardware)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fsdp.check_precision("bf16", "cpu")
        fsdp.check_precision("fp32", "cpu")
    slow = [w for w in seen if issubclass(w.category, fsdp.SlowPrecisionWarning)]
    assert len(slow) == (0 if hardware else 1)
    if slow:
        assert "model.mixed_precision=float32" in str(slow[0].message)


def grpo_batch(batch: TokenBatch) -> TokenBatch:
    g = torch.Generator().manual_seed(0)
    adv = (torch.randn(len(batch), 1, generator=g) * batch.loss_mask)
    old = torch.where(batch.loss_mask > 0, torch.full_like(batch.loss_mask, -3.0), torch.zeros_like(batch.loss_mask))
    return TokenBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask, loss_mask=batch.loss_mask,
                      old_logprobs=old, advantages=adv)


def test_grpo_with_reference_kl(tiny, batch) -> None:
    rl = grpo_batch(batch)
    cfg = GRPOConfig(kl_coef=0.1)
    with pytest.raises(ValueError, match="reference"):
        Learner(tiny, OptimConfig(lr=1e-3)).step(rl, "grpo", cfg)
    learner = Learner(tiny, OptimConfig(lr=1e-2, micro_batch_size=3), reference=True)
    first = learner.step(rl, "grpo", cfg)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    second = learner.step(rl, "grpo", cfg)
    assert second["kl"] > 0  # the reference stays frozen while the policy moves
    ref_params = list(learner.ref_model.parameters())
    assert not any(p.requires_grad for p in ref_params)


def test_bad_input_is_a_clear_error(tiny, batch) -> None:
    learner = Learner(tiny, OptimConfig(lr=1e-3))
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        learner.step(batch, "nope", SFTConfig())
    empty = TokenBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       loss_mask=torch.zeros_like(batch.loss_mask))
    with pytest.raises(ValueError, match="zero total loss weight"):
        learner.step(empty, "sft", SFTConfig())
    assert learner.version == 0
    with pytest.raises(ValueError, match="schedule"):
        OptimConfig(schedule="step")
    with pytest.raises(ValueError, match="lr"):
        OptimConfig(lr=0)
    with pytest.raises(ValueError, match="mixed_precision"):
        Learner(tiny, mixed_precision="fp8")
    with pytest.raises(ValueError, match="process group"):
        Learner(tiny, shard=True)
