"""Learner checkpoints: HF-loadable weights, exact resume (same loss curve as an uninterrupted run),
atomic writes, latest_checkpoint, and clear errors for missing/corrupt/mismatched checkpoints."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="the policy stack (transformers) is not installed")

import torch  # noqa: E402

from sqlrl.agent.chat_format import HFChatFormat  # noqa: E402
from sqlrl.learn.batch import sft_batch  # noqa: E402
from sqlrl.learn.checkpoint import (CheckpointError, checkpoint_dir, latest_checkpoint,  # noqa: E402
                                    load_checkpoint, read_manifest, save_checkpoint)
from sqlrl.learn.config import SFTConfig  # noqa: E402
from sqlrl.learn.engine import Learner  # noqa: E402
from sqlrl.learn.optim import OptimConfig  # noqa: E402
from sqlrl.policy.load import load_policy, tiny_path  # noqa: E402
from tests.unit.test_learn_engine import examples  # noqa: E402

OPTIM = OptimConfig(lr=3e-3, warmup_steps=2, total_steps=8, schedule="cosine", min_lr_ratio=0.1,
                    grad_clip=1.0, micro_batch_size=2, weight_decay=0.01)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_path()


@pytest.fixture(scope="module")
def batches(tiny):
    policy = load_policy(tiny)
    chat = HFChatFormat(policy.tokenizer)
    ex = examples()
    return [sft_batch([ex[i % 6], ex[(i + 1) % 6], ex[(i + 3) % 6]], chat, max_length=256,
                      pad_id=policy.pad_token_id) for i in range(6)]


@pytest.fixture(scope="module")
def saved(tiny, batches, tmp_path_factory):
    """An uninterrupted 6-step run that saves after step 3: (checkpoint, losses of steps 4-6, final weights)."""
    learner = Learner(tiny, OPTIM)
    for b in batches[:3]:
        learner.step(b, "sft", SFTConfig())
    path = save_checkpoint(learner, checkpoint_dir(tmp_path_factory.mktemp("ckpt"), learner.step_count))
    tail = [learner.step(b, "sft", SFTConfig()) for b in batches[3:]]
    return path, tail, learner.full_state_dict()


def test_resume_continues_the_same_loss_curve(tiny, batches, saved) -> None:
    path, tail, final = saved
    resumed = Learner(tiny, OPTIM)
    assert load_checkpoint(resumed, path) == 3 and resumed.version == 3
    again = [resumed.step(b, "sft", SFTConfig()) for b in batches[3:]]
    for a, b in zip(tail, again):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-7)
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-9)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert resumed.version == 6
    for key, value in final.items():
        torch.testing.assert_close(resumed.full_state_dict()[key], value, rtol=1e-6, atol=1e-7)


def test_saved_weights_load_with_from_pretrained(saved) -> None:
    from transformers import AutoModelForCausalLM

    path, _, _ = saved
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    policy = load_policy(path)  # tokenizer + chat template travel with the weights
    assert policy.tokenizer.chat_template
    manifest = read_manifest(path)
    assert manifest["step"] == 3 and manifest["world_size"] == 1 and manifest["optim"]["lr"] == OPTIM.lr
    ref = torch.load(path / "trainer_state.pt", weights_only=False)
    assert ref["step"] == 3 and ref["scheduler"]["last_epoch"] == 3
    assert set(model.state_dict()) == set(policy.model.state_dict())


def test_latest_checkpoint_ignores_temporary_and_foreign_folders(saved, tmp_path) -> None:
    path, _, _ = saved
    assert latest_checkpoint(tmp_path / "none") is None
    assert latest_checkpoint(path.parent) == path
    (path.parent / ".step-00000009.tmp-1").mkdir()
    (path.parent / "step-00000010").mkdir()  # no manifest: an interrupted copy, not a checkpoint
    assert latest_checkpoint(path.parent) == path


def test_missing_corrupt_and_mismatched_checkpoints(tiny, saved, tmp_path) -> None:
    import shutil

    path, _, _ = saved
    learner = Learner(tiny, OPTIM)
    with pytest.raises(CheckpointError, match="no checkpoint folder"):
        load_checkpoint(learner, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        load_checkpoint(learner, tmp_path / "empty")
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    with open(bad / "model.safetensors", "r+b") as f:
        f.seek(-16, 2)
        f.write(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="model.safetensors does not match its sha256"):
        load_checkpoint(learner, bad)
    other = tmp_path / "other"
    shutil.copytree(path, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["model"]["hidden_size"] += 1
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="different model"):
        load_checkpoint(learner, other)
    (other / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        load_checkpoint(learner, other)
    assert learner.version == 0  # nothing was changed by the failed loads
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(learner, path)
    assert read_manifest(path)["step"] == 3  # and the existing checkpoint is intact
    replaced = save_checkpoint(learner, tmp_path / "replace")
    assert save_checkpoint(learner, replaced, overwrite=True) == replaced
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
