"""sqlrl.learn.losses: GRPO by hand (clipping, dual clip, gradients), SFT = cross-entropy on the
assistant tokens, forward_logprobs = the backend's sampling log-probs, KL/entropy terms, weights."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sqlrl.agent import AgentLoop, HFChatFormat, LoopConfig
from sqlrl.learn import LOSSES
from sqlrl.learn.batch import SFTExample, TokenBatch, rl_batch, sft_batch
from sqlrl.learn.config import LOSS_AGG_MODES, GRPOConfig, SFTConfig, verl_policy_losses
from sqlrl.learn.losses import forward_logprobs, grpo_loss, grpo_loss_from_logprobs, sft_loss
from sqlrl.policy.hf_backend import HFBackend
from sqlrl.policy.types import SamplingParams
from sqlrl.tasks.types import Text2SQLTask

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def tiny():
    from sqlrl.policy.load import load_policy

    return load_policy("tiny")


@pytest.fixture(scope="module")
def rollouts(tiny):
    """Single-turn rollouts sampled by HFBackend from the tiny model (different lengths)."""
    questions = ["How many books are there?", "List every flight.", "Which patients visited twice?",
                 "Count the authors."]
    tasks = [Text2SQLTask(task_id=f"t{i}", db_id="x", question=q, gold_sql="SELECT 1") for i, q in enumerate(questions)]
    cfg = LoopConfig(mode="single", max_total_tokens=1024,
                     sampling=SamplingParams(max_new_tokens=10, temperature=TEMPERATURE, seed=3))
    trajs = AgentLoop(tasks, None, HFBackend(tiny), HFChatFormat(tiny.tokenizer), cfg).run()
    assert all(t.stop_reason == "single_turn" and t.n_generated > 0 for t in trajs)
    assert len({len(t.token_ids) for t in trajs}) > 1  # right padding is exercised
    return trajs


@pytest.fixture(scope="module")
def rl(tiny, rollouts):
    return rl_batch(rollouts, [1.0, 0.0, 0.5, 0.0], ["a", "a", "b", "b"], GRPOConfig(temperature=TEMPERATURE),
                    pad_id=tiny.pad_token_id)


# ------------------------------------------------------------------------------------------------
# GRPO by hand


def hand_batch(**extra) -> TokenBatch:
    """Row 0: advantage +1 on columns 1-3; row 1: advantage -1 on columns 1-2 (column 3 is padding)."""
    return TokenBatch(input_ids=torch.tensor([[5, 6, 7, 8], [5, 6, 7, 0]]),
                      attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
                      loss_mask=torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0.]]),
                      old_logprobs=torch.full((2, 4), -1.0),
                      advantages=torch.tensor([[0, 1, 1, 1], [0, -1, -1, 0.]]), **extra)


RATIOS = [[1.0, 1.5, 0.5, 1.0], [1.0, 5.0, 0.5, 1.0]]


def hand_logprobs() -> torch.Tensor:
    return (torch.tensor(RATIOS).log() - 1.0).requires_grad_()


def test_grpo_clipped_loss_and_gradient_by_hand():
    lp = hand_logprobs()
    out = grpo_loss_from_logprobs(lp, None, hand_batch(), GRPOConfig())
    # per token, -A * ratio vs -A * clip(ratio, 0.8, 1.2); max; for A < 0 also min(., -A * 3):
    #   row 0 (A=+1): r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped); r=0.5 -> max(-0.5, -0.8) = -0.5; r=1 -> -1
    #   row 1 (A=-1): r=5 -> max(5, 1.2) = 5, dual clip min(5, 3) = 3; r=0.5 -> max(0.5, 0.8) = 0.8 (clipped)
    assert out.loss.item() == pytest.approx((-1.2 - 0.5 - 1.0 + 3.0 + 0.8) / 5, abs=1e-6)
    assert out.weight == 5.0
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 5)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 5)
    assert out.metrics["ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5) + math.log(5) + math.log(0.5)) / 5,
                                                  abs=1e-6)
    assert out.metrics["pg_loss"] == pytest.approx(out.loss.item()) and "kl" not in out.metrics
    out.loss.backward()
    # d/d lp of -A * exp(lp - old) / 5 = -A * ratio / 5 where not clipped; 0 where clipped or off the mask
    want = [0, 0, -0.5 / 5, -1.0 / 5] + [0, 0, 0, 0]
    assert lp.grad.flatten().tolist() == pytest.approx(want, abs=1e-6)


def test_seq_mean_modes_weigh_sequences():
    lp = hand_logprobs()
    out = grpo_loss_from_logprobs(lp, None, hand_batch(), GRPOConfig(loss_agg_mode="seq-mean-token-mean"))
    assert out.weight == 2.0
    assert out.loss.item() == pytest.approx(((-1.2 - 0.5 - 1.0) / 3 + (3.0 + 0.8) / 2) / 2, abs=1e-6)
    out = grpo_loss_from_logprobs(lp, None, hand_batch(),
                                  GRPOConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=10))
    assert out.loss.item() == pytest.approx(((-1.2 - 0.5 - 1.0) + (3.0 + 0.8)) / 2 / 10, abs=1e-6)


def test_kl_term_present_only_with_a_coefficient_and_reference():
    ref = torch.full((2, 4), -1.2)
    lp = hand_logprobs()
    plain = grpo_loss_from_logprobs(lp, None, hand_batch(), GRPOConfig())
    # reference present, kl_coef 0: the KL is reported, not added
    watched = grpo_loss_from_logprobs(lp, None, hand_batch(ref_logprobs=ref), GRPOConfig())
    assert watched.loss.item() == pytest.approx(plain.loss.item()) and "kl" in watched.metrics
    with_kl = grpo_loss_from_logprobs(lp, None, hand_batch(ref_logprobs=ref), GRPOConfig(kl_coef=0.5))
    # low_var_kl (k3) per token: exp(ref - lp) - (ref - lp) - 1
    lps = [math.log(r) - 1.0 for r in (1.5, 0.5, 1.0, 5.0, 0.5)]
    k3 = sum(math.exp(-1.2 - x) - (-1.2 - x) - 1 for x in lps) / 5
    assert with_kl.metrics["kl"] == pytest.approx(k3, abs=1e-6) == watched.metrics["kl"]
    assert with_kl.loss.item() == pytest.approx(plain.loss.item() + 0.5 * k3, abs=1e-6)
    k1 = grpo_loss_from_logprobs(lp, None, hand_batch(ref_logprobs=ref), GRPOConfig(kl_coef=1.0, kl_type="k1"))
    assert k1.metrics["kl"] == pytest.approx(sum(x + 1.2 for x in lps) / 5, abs=1e-6)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs reference log-probs"):
        grpo_loss_from_logprobs(lp, None, hand_batch(), GRPOConfig(kl_coef=0.1))


def test_entropy_bonus_is_subtracted():
    lp = hand_logprobs()
    entropy = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 4.0, 6.0, 9.0]])
    plain = grpo_loss_from_logprobs(lp, entropy, hand_batch(), GRPOConfig())
    bonus = grpo_loss_from_logprobs(lp, entropy, hand_batch(), GRPOConfig(entropy_coef=0.1))
    assert plain.metrics["entropy"] == bonus.metrics["entropy"] == pytest.approx((1 + 2 + 3 + 4 + 6) / 5)
    assert bonus.loss.item() == pytest.approx(plain.loss.item() - 0.1 * 16 / 5, abs=1e-6)
    with pytest.raises(ValueError, match="needs the entropies"):
        grpo_loss_from_logprobs(lp, None, hand_batch(), GRPOConfig(entropy_coef=0.1))


@pytest.mark.parametrize("name", [n for n in verl_policy_losses() if n != "dro"])
def test_every_verl_policy_loss_runs_on_our_layout(name):
    out = grpo_loss_from_logprobs(hand_logprobs(), None, hand_batch(), GRPOConfig(policy_loss=name))
    assert math.isfinite(out.loss.item()) and out.weight == 5.0
    out.loss.backward()


# ------------------------------------------------------------------------------------------------
# On the tiny model


def test_forward_logprobs_equal_the_sampling_logprobs(tiny, rl, rollouts):
    with torch.no_grad():
        lp, entropy = forward_logprobs(tiny.model, rl, temperature=TEMPERATURE, with_entropy=True)
    m = rl.loss_mask.bool()
    assert int(m.sum()) == sum(t.n_generated for t in rollouts)
    assert (lp[m] - rl.old_logprobs[m]).abs().max().item() < 1e-4
    assert lp[:, 0].abs().sum() == 0 and lp[rl.attention_mask == 0].abs().sum() == 0
    # a real distribution's entropy at every predicted, real position
    assert (entropy[:, 1:][rl.attention_mask[:, 1:].bool()] > 0).all()
    # temperature 1 gives different numbers: the temperature is applied
    with torch.no_grad():
        lp1, _ = forward_logprobs(tiny.model, rl)
    assert (lp1[m] - rl.old_logprobs[m]).abs().max().item() > 1e-2
    with pytest.raises(ValueError, match="temperature"):
        forward_logprobs(tiny.model, rl, temperature=0)


def test_grpo_loss_on_policy(tiny, rl):
    cfg = GRPOConfig(temperature=TEMPERATURE)
    tiny.model.zero_grad()
    out = LOSSES["grpo"](tiny.model, rl, cfg)
    # on-policy: ratio 1 everywhere, nothing clipped, loss = -token-mean(advantage)
    m = rl.loss_mask
    assert out.loss.item() == pytest.approx(-(rl.advantages * m).sum().item() / m.sum().item(), abs=1e-4)
    assert out.metrics["pg_clipfrac"] == 0 and abs(out.metrics["ppo_kl"]) < 1e-4
    assert out.weight == rl.n_tokens and out.metrics["entropy"] > 0
    out.loss.backward()
    grads = [p.grad for p in tiny.model.parameters() if p.grad is not None]
    assert grads and sum(g.abs().sum().item() for g in grads) > 0
    tiny.model.zero_grad()


def test_micro_batch_losses_recombine_by_weight(tiny, rl):
    for mode in ("token-mean", "seq-mean-token-mean"):
        cfg = GRPOConfig(temperature=TEMPERATURE, loss_agg_mode=mode)
        with torch.no_grad():
            whole = grpo_loss(tiny.model, rl, cfg)
            parts = [grpo_loss(tiny.model, mb, cfg) for mb in rl.micro_batches(3)]
        total = sum(p.weight for p in parts)
        assert total == whole.weight
        assert sum(p.loss.item() * p.weight / total for p in parts) == pytest.approx(whole.loss.item(), abs=1e-5)


def test_a_micro_batch_without_trained_tokens_has_zero_weight_and_a_finite_loss(tiny, rl):
    empty = dataclasses.replace(rl.select([0]), loss_mask=torch.zeros_like(rl.select([0]).loss_mask))
    for loss, cfg in ((grpo_loss, GRPOConfig(temperature=TEMPERATURE)), (sft_loss, SFTConfig())):
        out = loss(tiny.model, empty, cfg)
        assert out.weight == 0 and out.loss.item() == 0 and out.loss.requires_grad
        out.loss.backward()
    tiny.model.zero_grad()


def test_sft_loss_is_cross_entropy_on_assistant_tokens_only(tiny):
    fmt = HFChatFormat(tiny.tokenizer)
    examples = [SFTExample(({"role": "system", "content": "You write SQL."},
                            {"role": "user", "content": "How many books?"},
                            {"role": "assistant", "content": "SELECT count(*) FROM books"},
                            {"role": "user", "content": "And authors?"},
                            {"role": "assistant", "content": "SELECT count(*) FROM authors"})),
                SFTExample(({"role": "user", "content": "List flights"},
                            {"role": "assistant", "content": "SELECT * FROM flights"}))]
    batch = sft_batch(examples, fmt, max_length=512, pad_id=tiny.pad_token_id)
    out = LOSSES["sft"](tiny.model, batch, SFTConfig())
    with torch.no_grad():
        logits = tiny.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    labels = batch.input_ids[:, 1:].masked_fill(batch.loss_mask[:, 1:] == 0, -100)
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))
    assert out.loss.item() == pytest.approx(ce.item(), abs=1e-5) and out.metrics["nll"] == pytest.approx(ce.item())
    # the trained tokens are exactly the assistant texts + <|im_end|>
    trained = batch.input_ids[0][batch.loss_mask[0].bool()].tolist()
    assert fmt.decode(trained) == "SELECT count(*) FROM books<|im_end|>SELECT count(*) FROM authors<|im_end|>"
    assert out.weight == batch.n_tokens
    seq = sft_loss(tiny.model, batch, SFTConfig(loss_agg_mode="seq-mean-token-mean"))
    per_row = [-(torch.nn.functional.log_softmax(logits[r, :-1], -1).gather(-1, batch.input_ids[r, 1:, None])[:, 0]
                 * batch.loss_mask[r, 1:]).sum().item() / batch.loss_mask[r].sum().item() for r in range(2)]
    assert seq.weight == 2 and seq.loss.item() == pytest.approx(sum(per_row) / 2, abs=1e-5)


# ------------------------------------------------------------------------------------------------
# Bad inputs


def test_losses_reject_wrong_batches_and_configs(tiny, rl):
    sft_only = dataclasses.replace(rl, old_logprobs=None, advantages=None)
    with pytest.raises(ValueError, match="old_logprobs and advantages"):
        grpo_loss(tiny.model, sft_only, GRPOConfig())
    with pytest.raises(ValueError, match="expected a GRPOConfig"):
        grpo_loss(tiny.model, rl, SFTConfig())
    with pytest.raises(ValueError, match="expected a SFTConfig"):
        sft_loss(tiny.model, rl, GRPOConfig())
    with pytest.raises(ValueError, match="log_prob has shape"):
        grpo_loss_from_logprobs(torch.zeros(2, 3), None, hand_batch(), GRPOConfig())


@pytest.mark.parametrize("kwargs, message", [
    (dict(clip_ratio_low=1.0), "clip_ratio_low must be in"),
    (dict(clip_ratio_high=-0.1), "clip_ratio_high must be >= 0"),
    (dict(clip_ratio_c=1.0), "clip_ratio_c must be > 1"),
    (dict(clip_ratio_c=float("nan")), "finite number"),
    (dict(kl_coef=-1), "kl_coef must be >= 0"),
    (dict(entropy_coef="0.1"), "entropy_coef must be a finite number"),
    (dict(temperature=0), "temperature must be > 0"),
    (dict(kl_type="full"), "kl_type 'full'"),
    (dict(policy_loss="ppo2"), "policy_loss 'ppo2' is not a verl policy loss"),
    (dict(loss_agg_mode="token-sum"), "'token-sum' is not supported"),
    (dict(loss_agg_mode="mean"), "loss_agg_mode 'mean'"),
    (dict(loss_agg_mode="seq-mean-token-sum-norm"), "needs loss_scale_factor"),
    (dict(loss_scale_factor=0), "loss_scale_factor must be a positive int"),
    (dict(norm_adv_by_std_in_grpo=1), "must be a bool"),
])
def test_grpo_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**kwargs)


def test_configs_accept_every_supported_mode():
    for mode in LOSS_AGG_MODES:
        SFTConfig(loss_agg_mode=mode, loss_scale_factor=8)
        GRPOConfig(loss_agg_mode=mode, loss_scale_factor=8)
    assert GRPOConfig(kl_type="k3+").kl_type == "k3+"
    with pytest.raises(ValueError, match="SFTConfig.loss_agg_mode 'token-sum'"):
        SFTConfig(loss_agg_mode="token-sum")


def test_trained_only_logprobs_equal_the_full_computation_on_trained_columns():
    import torch

    from sqlrl.learn.batch import TokenBatch
    from sqlrl.learn.losses import forward_logprobs
    from sqlrl.policy.load import load_policy

    model = load_policy("tiny").model
    torch.manual_seed(0)
    ids = torch.randint(5, 200, (3, 12))
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0
    mask = torch.zeros(3, 12)
    mask[0, 7:] = 1
    mask[1, 5:9] = 1
    mask[2, 6:9] = 1
    batch = TokenBatch(input_ids=ids, attention_mask=attn, loss_mask=mask)
    full, full_h = forward_logprobs(model, batch, with_entropy=True)
    part, part_h = forward_logprobs(model, batch, with_entropy=True, trained_only=True)
    trained = mask.bool()
    assert torch.allclose(full[trained], part[trained], atol=1e-6)
    assert torch.allclose(full_h[trained], part_h[trained], atol=1e-5)
    assert (part[:, :5] == 0).all()  # nothing computed before the first trained column


# ------------------------------------------------------------------------------------------------
# share_prefix: a group's prompt runs once


def shared_prompt_batch() -> TokenBatch:
    """Rows 0-3 share prompt A (40 tokens), rows 4-6 prompt B (33), row 7 has a prompt of its own, and
    row 8 starts like A but trains from an earlier column (another prompt); right padding of
    several lengths, and row 2's trained span stops before its last token."""
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(5, 200, (n,), generator=gen) for n in (40, 33, 37))
    prompts = [a, a, a, a, b, b, b, c, a[:30]]
    lengths = [5, 17, 9, 12, 3, 25, 8, 14, 11]
    width = max(len(p) + n for p, n in zip(prompts, lengths))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    attn, mask = torch.zeros_like(ids), torch.zeros(len(prompts), width)
    for r, (p, n) in enumerate(zip(prompts, lengths)):
        seq = torch.cat([p, torch.randint(5, 200, (n,), generator=gen)])
        ids[r, :len(seq)], attn[r, :len(seq)], mask[r, len(p):len(seq)] = seq, 1, 1
    mask[2, 40 + 6:] = 0
    return TokenBatch(input_ids=ids, attention_mask=attn, loss_mask=mask)


def test_prompt_clusters_are_the_rows_with_one_prompt():
    from sqlrl.learn.losses import prompt_clusters

    b = shared_prompt_batch()
    assert prompt_clusters(b) == [(39, [0, 1, 2, 3]), (32, [4, 5, 6])]
    # a padded (not real) column inside the prompt, or no trained column: never shared
    b2 = dataclasses.replace(b, attention_mask=b.attention_mask.clone(), loss_mask=b.loss_mask.clone())
    b2.attention_mask[1, 3] = 0
    b2.loss_mask[5] = 0
    assert prompt_clusters(b2) == [(39, [0, 2, 3]), (32, [4, 6])]


def test_shared_prefix_logprobs_and_gradients_equal_the_plain_computation(tiny):
    b = shared_prompt_batch()
    mask = b.loss_mask.bool()

    def run(share: bool):
        tiny.model.zero_grad()
        lp, h = forward_logprobs(tiny.model, b, temperature=TEMPERATURE, with_entropy=True, trained_only=True,
                                 share_prefix=share)
        ((lp * b.loss_mask).sum() + 0.1 * (h * b.loss_mask).sum()).backward()
        grads = torch.cat([p.grad.flatten() for p in tiny.model.parameters() if p.grad is not None])
        return lp.detach(), h.detach(), grads

    plain, shared = run(False), run(True)
    tiny.model.zero_grad()
    assert plain[0].shape == shared[0].shape == b.input_ids.shape
    assert torch.allclose(plain[0][mask], shared[0][mask], atol=1e-5)
    assert torch.allclose(plain[1][mask], shared[1][mask], atol=1e-5)
    assert (shared[0][~b.attention_mask.bool()] == 0).all()  # padding stays 0
    assert ((plain[2] - shared[2]).norm() / plain[2].norm()).item() < 1e-5
    # the whole loss: grpo_loss with and without sharing agrees, metrics included
    rl = dataclasses.replace(b, old_logprobs=plain[0], advantages=torch.where(mask, 0.5, 0.0))
    on = grpo_loss(tiny.model, rl, GRPOConfig(temperature=TEMPERATURE))
    off = grpo_loss(tiny.model, rl, GRPOConfig(temperature=TEMPERATURE, share_prefix=False))
    assert on.loss.item() == pytest.approx(off.loss.item(), abs=1e-5)
    assert on.metrics["rollout_probs_diff_max"] < 1e-4 and off.metrics["rollout_probs_diff_max"] < 1e-6
    with pytest.raises(ValueError, match="share_prefix must be a bool"):
        GRPOConfig(share_prefix="yes")
