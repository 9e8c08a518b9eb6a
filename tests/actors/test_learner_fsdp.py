"""The learner group on Ray: 2 FSDP2 ranks over gloo give the single-process losses and weights,
checkpoint (HF-loadable) and resume on 2 ranks, GRPO groups with shared prompts, weight sync to a
rollout worker with versions, consistent errors keep the group usable, a dead rank is a clear error
(not a hang)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

import torch  # noqa: E402

from actors.learner import LearnerGroup, LearnerGroupError  # noqa: E402
from actors.rollout import PolicySpec, RolloutConfig, RolloutGroup  # noqa: E402
from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.learn.batch import sft_batch  # noqa: E402
from sqlrl.learn.checkpoint import read_manifest  # noqa: E402
from sqlrl.learn.config import GRPOConfig, SFTConfig  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402
from tests.unit.test_learn_engine import examples  # noqa: E402
from tests.unit.test_learn_losses import shared_prompt_batch  # noqa: E402

# micro_batch_size=2 on 5-row batches: rank 0 gets 3 rows (2 passes), rank 1 gets 2 rows (1 pass +
# one zero-weight pass), the in-process learner 5 rows (3 passes) — all must give the same update.
OPTIM = OptimConfig(lr=3e-3, warmup_steps=1, total_steps=6, grad_clip=1.0, micro_batch_size=2)
STEPS = 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_path()


@pytest.fixture(scope="module")
def batches(tiny):
    policy = load_policy(tiny)
    chat = HFChatFormat(policy.tokenizer)
    ex = examples()
    return [sft_batch([ex[(i + j) % 6] for j in range(5)], chat, max_length=256, pad_id=policy.pad_token_id)
            for i in range(STEPS)]


@pytest.fixture(scope="module")
def single(tiny, batches):
    group = LearnerGroup(tiny, OPTIM, in_process=True)
    metrics = [group.step(b, "sft", SFTConfig()) for b in batches]
    return metrics, group.state_dict()


def two_ranks(tiny) -> LearnerGroup:
    return LearnerGroup(tiny, OPTIM, n=2, num_cpus=1, timeout_s=600)  # rank start-up is slow on loaded cores


@pytest.fixture(scope="module")
def fsdp_run(ray_session, tiny, batches, tmp_path_factory):
    """The module's 2-rank group, after the comparison's ``STEPS`` SFT steps (a checkpoint after
    step 2): ``(group, metrics, checkpoint, weights after the last step)``. They run when the group
    starts, so every test finds it in a known state in any test order (tests step and reload it;
    none stops it)."""
    group = two_ranks(tiny)
    try:
        got = [group.step(b, "sft", SFTConfig()) for b in batches[:2]]
        path = group.save(tmp_path_factory.mktemp("fsdp") / "step-2")
        got += [group.step(b, "sft", SFTConfig()) for b in batches[2:]]
        yield group, got, path, group.state_dict()
    finally:
        group.shutdown()


@pytest.fixture
def fsdp(fsdp_run) -> LearnerGroup:
    return fsdp_run[0]


def test_two_fsdp_ranks_match_one_process(fsdp_run, single, batches) -> None:
    fsdp, got, path, state = fsdp_run
    metrics, weights = single
    for a, b in zip(metrics, got, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["tokens"] == a["tokens"] and b["lr"] == pytest.approx(a["lr"])
    assert [m["version"] for m in got] == list(range(1, STEPS + 1))
    assert set(state) == set(weights)
    for key, value in weights.items():
        torch.testing.assert_close(state[key], value, rtol=1e-3, atol=1e-4)

    # the checkpoint written by 2 ranks is a Hugging Face folder, and resumes on the same curve
    from transformers import AutoModelForCausalLM

    assert read_manifest(path)["world_size"] == 2
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    assert set(model.state_dict()) == set(weights)
    assert fsdp.load(path) == 2 and fsdp.version == 2
    again = [fsdp.step(b, "sft", SFTConfig()) for b in batches[2:]]
    for a, b in zip(got[2:], again, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-7)


def test_grpo_groups_with_shared_prompts_match_one_process(fsdp, tmp_path) -> None:
    """A GRPO batch of groups (one prompt, several samples) with ``share_prefix`` on (the default):
    the in-process learner runs each prompt once; FSDP ranks run rows whole with grad (the shared
    prompt's late backward would read freed weights) -- the step (KL term included) is the same."""
    import dataclasses

    b = shared_prompt_batch()
    mask = b.loss_mask.bool()
    batch = dataclasses.replace(b, old_logprobs=torch.where(mask, -5.0, 0.0), ref_logprobs=torch.where(mask, -5.0, 0.0),
                                advantages=torch.where(mask, 0.5, 0.0) - 0.3 * (torch.arange(len(b)) % 2)[:, None] * mask)
    cfg = GRPOConfig(kl_coef=0.05)
    assert cfg.share_prefix
    one = LearnerGroup(fsdp.save(tmp_path / "start"), OPTIM, in_process=True)
    want, got = one.step(batch, "grpo", cfg), fsdp.step(batch, "grpo", cfg)
    one.shutdown()
    assert got["n_tokens"] == want["n_tokens"] and want["kl"] > 0
    for key in ("loss", "pg_loss", "kl", "entropy"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)


def test_weight_sync_changes_the_rollout_worker(fsdp, tiny) -> None:
    rollout = RolloutGroup(RolloutConfig(PolicySpec(str(tiny)), in_process=True))
    worker = rollout.workers[0]
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    before = worker.policy.model(input_ids=ids).logits
    version, seconds = fsdp.sync_to(rollout)
    assert version == fsdp.version > 0 and worker.get_version() == version and seconds >= 0
    after = worker.policy.model(input_ids=ids).logits
    assert not torch.allclose(before, after)
    state = fsdp.state_dict()
    for key, value in worker.policy.model.state_dict().items():
        assert torch.equal(value, state[key])
    assert fsdp.state_dict_ref() is fsdp.state_dict_ref()  # one object-store copy per version


def test_consistent_errors_keep_the_group_usable(fsdp, batches, tmp_path) -> None:
    from sqlrl.learn.checkpoint import CheckpointError

    with pytest.raises(ValueError, match="unknown loss"):
        fsdp.step(batches[0], "nope", SFTConfig())
    with pytest.raises(ValueError, match="every rank needs at least one row"):
        fsdp.step(batches[0].select([0]), "sft", SFTConfig())
    with pytest.raises(CheckpointError, match="no checkpoint folder"):
        fsdp.load(tmp_path / "missing")
    version = fsdp.version
    assert fsdp.step(batches[0], "sft", SFTConfig())["version"] == version + 1


def test_a_dead_rank_is_a_clear_error(ray_session, tiny, batches) -> None:
    group = two_ranks(tiny)  # its own: a group with a dead rank is stopped for good
    try:
        ray_session.kill(group.ranks[1], no_restart=True)
        with pytest.raises(LearnerGroupError, match="rank 1 died"):
            group.step(batches[0], "sft", SFTConfig())
        with pytest.raises(LearnerGroupError, match="stopped"):
            group.step(batches[0], "sft", SFTConfig())
    finally:
        group.shutdown()


def test_bad_arguments_fail_before_any_actor_starts(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no model folder"):
        LearnerGroup(tmp_path / "missing", OPTIM, n=2)
    with pytest.raises(ValueError, match="mixed_precision"):
        LearnerGroup("tiny", OPTIM, n=2, mixed_precision="fp8")
    with pytest.raises(ValueError, match="n \\(learner ranks\\)"):
        LearnerGroup("tiny", OPTIM, n=-1)
