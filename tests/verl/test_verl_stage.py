"""``python -m jobs.verl_stage`` on CPU: the data it writes, the verl command it prints (composed
with verl's own ``ppo_trainer`` config and checked by verl's ``validate_config``), the GRPO
settings against sqlrl's own stage configs, stage 3's reward through verl's reward-function
loader, and its errors. verl's trainer itself needs GPUs and is not run here."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (it is in the CPU lock)")

from jobs import verl_stage  # noqa: E402

SMALL = ["--set", "data.train_size=8", "--set", "data.eval_size=4", "--set", "data.eval_split=dev"]


def run_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = verl_stage.main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    from sqlrl.synth.dataset import build_default_dataset

    root = tmp_path_factory.mktemp("synth")
    build_default_dataset(root, seed=0, n_per_domain=12, domains=["shop"])
    return root


@pytest.fixture(scope="module")
def dry_runs(synth, tmp_path_factory) -> dict[int, dict[str, Any]]:
    """Both stages' --dry-run: {stage: {out, env, command}} (the printed line, parsed back)."""
    runs = {}
    for stage in (3, 4):
        out = tmp_path_factory.mktemp(f"verl{stage}")
        rc, stdout, err = run_main(["--stage", str(stage), "--data-dir", str(synth), "--out", str(out),
                                    "--model", "/models/m", "--dry-run", *SMALL, "trainer.total_epochs=3"])
        assert rc == 0, err
        words = shlex.split(stdout.strip())
        env = dict(w.split("=", 1) for w in words[:3])
        runs[stage] = {"out": out, "env": env, "command": words[3:], "stderr": err}
    return runs


def test_dry_run_writes_the_stage_data(dry_runs, synth):
    import pyarrow.parquet as pq

    from sqlrl.tasks.loaders.verl import AGENT_NAME, load_verl

    four, three = dry_runs[4]["out"], dry_runs[3]["out"]
    rows = pq.read_table(four / "train.parquet").to_pylist()
    assert len(rows) == 8 and {r["agent_name"] for r in rows} == {AGENT_NAME} == {"sqlrl_agent"}
    assert {r["extra_info"]["split"] for r in rows} == {"train"}
    assert len(load_verl(four / "val.parquet").tasks) == 4
    assert "execute_sql" in rows[0]["prompt"][0]["content"]
    # stage 3: single turn, no agent loop named (verl's single_turn_agent), no tools in the prompt
    assert "agent_name" not in pq.read_table(three / "train.parquet").column_names
    prompt = pq.read_table(three / "train.parquet").to_pylist()[0]["prompt"][0]["content"]
    assert "<solution>" in prompt and "execute_sql" not in prompt
    catalog = json.loads((four / "catalog.json").read_text())
    assert set(catalog) == {"shop"} and Path(catalog["shop"]["sqlite"].removeprefix("sqlite:///")).is_file()
    assert "stage4 train: kept 8 of 8" in dry_runs[4]["stderr"]


@pytest.mark.parametrize("stage", [3, 4])
def test_printed_command_composes_with_verls_config(dry_runs, stage):
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    run = dry_runs[stage]
    out, command = run["out"], run["command"]
    assert command[1:5] == ["-m", "verl.trainer.main_ppo", "--config-path", str(verl_stage.CONFIG_DIR)]
    assert command[5:7] == ["--config-name", f"stage{stage}"]
    cfg = verl_stage.compose(command)
    assert cfg.data.train_files == str(out / "train.parquet") and cfg.data.val_files == str(out / "val.parquet")
    assert cfg.actor_rollout_ref.model.path == "/models/m"
    assert cfg.trainer.default_local_dir == str(out / "checkpoints") and cfg.trainer.save_freq > 0
    assert cfg.trainer.total_epochs == 3  # the user's override, last, wins
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 4
    fn = cfg.reward.custom_reward_function
    assert (fn.path, fn.name) == ("pkg://actors.verl.reward_fn", "compute_score")
    assert fn.reward_kwargs.reward == ("hybrid_single" if stage == 3 else "hybrid_agentic")
    assert fn.reward_kwargs.catalog == str(out / "catalog.json")
    assert get_custom_reward_fn(cfg).args[0].__module__ == "actors.verl.reward_fn"
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    if stage == 4:
        assert rollout.multi_turn.enable and rollout.agent.default_agent_loop == "sqlrl_agent"
        assert rollout.multi_turn.tool_config_path == str(verl_stage.CONFIG_DIR / "tools.yaml")
        assert rollout.agent.agent_loop_config_path == str(verl_stage.CONFIG_DIR / "agent_loop.yaml")
    else:
        assert not rollout.multi_turn.enable and rollout.agent.default_agent_loop == "single_turn_agent"
    # the Ray workers' environment, and the printed line's: the repo root, the catalog
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert dict(env) == run["env"] and env.SQLRL_VERL_CATALOG == str(out / "catalog.json")
    assert env.PYTHONPATH.split(":")[0] == env.SQLRL_ROOT == str(verl_stage.ROOT)
    # verl's own checks and config classes, as main_ppo runs them first
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert not need_reference_policy(cfg)  # no KL: no reference model (sqlrl's kl_coef = 0)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.algorithm)


@pytest.mark.parametrize("stage", [3, 4])
def test_grpo_settings_match_sqlrls_own_stage(dry_runs, stage):
    from curriculum.config import load_stage_config

    sqlrl = load_stage_config(verl_stage.ROOT / "jobs" / "configs" / f"stage{stage}.yaml")
    rl, optim, loss = sqlrl.rl, sqlrl.rl.optim, sqlrl.rl.loss
    cfg = verl_stage.compose(dry_runs[stage]["command"])
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert rollout.n == rl.group_size
    assert (rollout.temperature, rollout.top_p) == (rl.temperature, rl.top_p)
    assert (rollout.val_kwargs.temperature, rollout.val_kwargs.do_sample) == (sqlrl.eval.temperature, False)
    assert (actor.optim.lr, actor.optim.weight_decay, actor.optim.lr_warmup_steps) == (
        optim.lr, optim.weight_decay, optim.warmup_steps)
    assert (actor.optim.lr_scheduler_type, actor.optim.min_lr_ratio, actor.optim.clip_grad) == (
        optim.schedule, optim.min_lr_ratio, optim.grad_clip)
    assert list(actor.optim.betas) == list(optim.betas)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (
        loss.clip_ratio_low, loss.clip_ratio_high, loss.clip_ratio_c)
    assert (actor.loss_agg_mode, actor.policy_loss.loss_mode) == (loss.loss_agg_mode, loss.policy_loss)
    assert actor.use_kl_loss == (loss.kl_coef > 0) and not cfg.algorithm.use_kl_in_reward
    assert actor.entropy_coeff == loss.entropy_coef
    assert cfg.algorithm.norm_adv_by_std_in_grpo == loss.norm_adv_by_std_in_grpo
    assert actor.ppo_epochs == rl.updates_per_batch
    if stage == 4:
        assert rollout.multi_turn.max_assistant_turns == sqlrl.rollout.max_turns


def test_stage3_reward_scores_correct_and_wrong_answers(dry_runs):
    """verl's loader and call (as its naive reward manager makes it) on the dry run's own rows,
    databases and catalog: sqlrl's hybrid_single reward parses and executes the single answer."""
    import pyarrow.parquet as pq
    from verl.trainer.ppo.reward import get_custom_reward_fn

    run = dry_runs[3]
    score_fn = get_custom_reward_fn(verl_stage.compose(run["command"]))
    rows = pq.read_table(run["out"] / "train.parquet").to_pylist()
    row = next(r for r in rows if r["extra_info"]["task_kind"] == "text2sql")
    gold = row["reward_model"]["ground_truth"]

    def score(answer: str, **change: Any) -> dict[str, float]:
        return score_fn(data_source=row["data_source"], solution_str=answer, ground_truth=gold,
                        extra_info={**row["extra_info"], "num_turns": 2, **change})

    right = score(f"<thought>the question asks for this.</thought><solution>{gold}</solution>")
    wrong = score("<thought>a guess.</thought><solution>SELECT 424242 AS nope</solution>")
    broken = score("<thought>a guess.</thought><solution>SELECT nope FROM nowhere</solution>")
    unparsed = score(gold)  # no <thought>/<solution>: never executed
    assert right["score"] == 1.0 and right["result"] == 1.0 and right["excluded"] == 0.0
    assert wrong["score"] == 0.0 and wrong["executed"] == 1.0 and wrong["excluded"] == 0.0
    assert broken["score"] == 0.0 and broken["executed"] == 0.0
    assert unparsed["score"] == 0.0 and unparsed["format"] == 0.0
    assert set(right) == set(wrong) == set(broken) == set(unparsed)
    tampered = score_fn(data_source="x", solution_str=f"<thought>t</thought><solution>{gold}</solution>",
                        ground_truth="SELECT 1", extra_info=row["extra_info"])
    assert tampered["score"] == 0.0 and tampered["excluded"] == 1.0


def test_errors_are_one_line_with_status_2(synth, tmp_path):
    rc, _, err = run_main(["--stage", "5", "--data-dir", str(synth), "--dry-run"])
    assert rc == 2 and "argument --stage: invalid choice: 5 (choose from 3, 4)" in err
    rc, _, err = run_main(["--stage", "4", "--data-dir", str(tmp_path / "none"), "--dry-run"])
    assert rc == 2 and err.strip() == (f"jobs.verl_stage: --data-dir {tmp_path / 'none'} does not exist "
                                       f"(make it: python -m sqlrl.synth --out {tmp_path / 'none'})")
    rc, _, err = run_main(["--stage", "3", "--data-dir", str(tmp_path), "--dry-run"])
    assert rc == 2 and "holds no manifest.json" in err and len(err.strip().splitlines()) == 1
    out = tmp_path / "out"
    rc, _, err = run_main(["--stage", "4", "--data-dir", str(synth), "--out", str(out), "--dry-run", *SMALL,
                           "no_such.key=1"])
    assert rc == 2 and err.strip().startswith("jobs.verl_stage: verl's config does not compose")
    assert not out.exists()  # checked before the data build
    rc, _, err = run_main(["--stage", "4", "--data-dir", str(synth), "--out", str(out), "--dry-run",
                           "--set", "data.train_size=0"])
    assert rc == 2 and err.startswith("jobs.verl_stage: --set:") and len(err.strip().splitlines()) == 1
    from sqlrl.agent.prompts import record_schema_style

    model = tmp_path / "compact_model"
    model.mkdir()
    record_schema_style(model, "compact")  # trained with the compact rendering; the prompts would be create
    rc, _, err = run_main(["--stage", "4", "--data-dir", str(synth), "--out", str(out), "--dry-run", *SMALL,
                           "--model", str(model), "--set", "model.schema_style=create"])
    assert rc == 2 and "trained with schema_style 'compact'" in err and "--set model.schema_style=compact" in err
    assert not out.exists()


def test_without_a_gpu_the_trainer_is_refused(synth, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: verl's trainer would start")
    rc, stdout, err = run_main(["--stage", "4", "--data-dir", str(synth), "--out", str(tmp_path / "o"),
                                "--model", "/models/m"])
    assert rc == 2 and stdout == "" and len(err.strip().splitlines()) == 1
    assert "needs NVIDIA GPUs with CUDA" in err and "--dry-run" in err
    assert not (tmp_path / "o").exists()
