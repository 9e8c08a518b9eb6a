"""The configuration of one curriculum stage, as frozen dataclasses mirrored by ``jobs/configs/*.yaml``.

``load_stage_config(path, overrides)`` reads a YAML file into ``StageConfig`` through
``sqlrl.config`` (unknown keys and wrong types are errors). One dataclass serves every stage: a
stage reads the sections it needs (SFT stages ``teacher`` and ``sft``; RL stages ``rl``) and the
others keep their defaults.

Guarantees:
- ``StageConfig.stage`` names an entry of the stage registry (``curriculum.stages.STAGES``, the one
  place stages are defined: its mode, its order); ``model.init == "previous"`` means the checkpoint
  the previous stage left in ``run_dir/<previous stage>/final`` (the first stage has none: an error).
- A stage job never replaces a finished result (``run_dir/<stage>/summary.json`` or ``final/``,
  ``existing_result()``) unless ``overwrite: true``.
- ``data.mixture`` is a Zeno task mixture ``{"text2sql": w, "critic": w}`` (Talon: critic only),
  validated by ``curriculum.mixing.MixtureConfig``.
- ``rl.loss.temperature`` always equals ``rl.temperature`` (the learner's log-probs are taken at the
  temperature the rollouts were sampled at); a different explicit value is an error.
- Defaults are the micro-scale main job on the embedded default (SmolLM2-135M, generated data,
  in-process); the GPU path is the same config with ``cluster`` and ``rollout.backend`` changed.
- ``reward`` (``sqlrl.rewards.RewardConfig``) reaches every reward scorer of the stage
  (``jobs.runtime.Runtime``): ``reward.test_suite`` switches test-suite execution match on.
- ``cluster.placement`` names a profile of ``deploy/placement.yaml`` (what each kind of actor asks
  Ray for; ``curriculum/placement.py``); an unknown one is an error naming the known profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Sequence

from sqlrl.config import load_config
from sqlrl.learn.config import GRPOConfig, SFTConfig
from sqlrl.learn.optim import OptimConfig
from sqlrl.learn.resume import CheckpointSettings  # noqa: F401  (checkpoint.*: one definition, the core's)
from sqlrl.policy.spec import PolicySpec, dtype_name
from sqlrl.rewards import RewardConfig

from .stages import STAGES, StageSpec, previous_stage, stage_spec

if TYPE_CHECKING:
    from curriculum.placement import Profile
    from curriculum.teachers import Teacher

__all__ = ["STAGES", "StageConfig", "load_stage_config"]  # STAGES: the registry (curriculum.stages)


@dataclass(frozen=True)
class ModelConfig:
    init: str = "smollm2-135m"  # a model name (tiny, smollm2-135m), a checkpoint folder, or "previous"
    # the learner's precision: float32, or bfloat16 (autocast / FSDP2 mixed precision; fp32 weights
    # and Adam state); fp32 / bf16 accepted and normalised (sqlrl.policy.spec.dtype_name)
    mixed_precision: str = "float32"
    # How prompts render the schema (sqlrl.agent.prompts.SCHEMA_STYLES: create, compact). None is
    # resolved when the config is made ($SQLRL_SCHEMA_STYLE, else the default), so config.yaml
    # records the style a stage used; its checkpoint records it too, and a stage refuses to start
    # from a checkpoint trained with another one.
    schema_style: str | None = None

    def __post_init__(self) -> None:
        from sqlrl.agent.prompts import schema_style
        from sqlrl.learn.fsdp import MIXED_PRECISION

        object.__setattr__(self, "schema_style", schema_style(self.schema_style))
        precision = dtype_name(self.mixed_precision, "model.mixed_precision")
        if precision not in MIXED_PRECISION:
            raise ValueError(f"model.mixed_precision must be one of {', '.join(MIXED_PRECISION)}, got "
                             f"{self.mixed_precision!r}")
        object.__setattr__(self, "mixed_precision", precision)


@dataclass(frozen=True)
class DataConfig:
    synth_dir: str = "runs/data/synth"  # the embedded default data (generated when missing)
    n_per_domain: int = 60  # generation size per domain when synth_dir has no data yet
    domains: tuple[str, ...] = ()  # () = every generated domain
    spider: str | None = None  # a Spider folder: Spider-derived tasks instead of generated ones
    train_split: str = "train"
    eval_split: str = "test"  # held-out tasks (heldout_test: held-out databases too; test+dev: both unused splits)
    difficulties: tuple[str, ...] = ()  # () = all
    mixture: dict[str, float] = field(default_factory=lambda: {"text2sql": 0.5, "critic": 0.5})
    eval_mixture: dict[str, float] | None = None  # held-out kinds; None = mixture (Talon trained on critic, scored on both)
    train_size: int = 32
    eval_size: int = 16
    seed: int = 0
    # True: train only on tasks that no earlier stage of this run_dir trained on (by origin: a
    # debugging task made from a question counts as that question), so RL is not rewarded for
    # what SFT memorised (jobs.stage_data.seen_origins)
    unseen: bool = False

    @property
    def held_out_mixture(self) -> dict[str, float]:
        return dict(self.eval_mixture if self.eval_mixture is not None else self.mixture)

    def __post_init__(self) -> None:
        from curriculum.mixing import MixtureConfig

        MixtureConfig(weights=self.mixture, size=max(1, self.train_size), seed=self.seed)
        if self.eval_mixture is not None:
            MixtureConfig(weights=self.eval_mixture, size=max(1, self.eval_size), seed=self.seed)
        if self.train_size < 1 or self.eval_size < 0:
            raise ValueError("data.train_size must be >= 1 and data.eval_size >= 0")
        shared = set(self.train_split.split("+")) & set(self.eval_split.split("+"))
        if shared:
            raise ValueError(f"data.train_split={self.train_split!r} and data.eval_split="
                             f"{self.eval_split!r} share {sorted(shared)}: held-out tasks would be trained on")


@dataclass(frozen=True)
class ClusterConfig:
    ray: bool = False  # False: everything in-process; True: Ray actors (ray job submit sets address)
    address: str | None = None  # None: RAY_ADDRESS or a local instance
    # What each kind of actor asks Ray for (CPUs, GPUs, custom resources): a profile of
    # deploy/placement.yaml (curriculum/placement.py), the file the cluster definitions are checked against.
    placement: str = "cpu"
    rollout_workers: int = 1
    learner_ranks: int = 1
    reward_actors: int = 1
    rollout_num_cpus: float | None = None  # None: the placement profile's; a number overrides it
    learner_num_cpus: float | None = None

    def __post_init__(self) -> None:
        self.asks()  # an unknown profile or a broken placement file fails here, naming what is known

    def asks(self) -> "Profile":
        """The placement profile with this run's CPU overrides applied."""
        from curriculum.placement import load_profile

        return load_profile(self.placement).with_cpus(rollout=self.rollout_num_cpus,
                                                      learner=self.learner_num_cpus)


@dataclass(frozen=True)
class RolloutSettings:
    # How the stage's policy generates (rollouts, evaluation, inference): the fields of
    # sqlrl.policy.spec.PolicySpec with its defaults -- backend (an engine: auto = vllm where it can
    # run the model, else hf; hf, vllm, hf-batched, vllm-batched), dtype (float32 | bfloat16 |
    # float16; fp32 / bf16 / fp16 accepted and normalised), device (where hf generation runs: auto =
    # the GPU when the rollout process sees one, not beside vLLM; cpu, cuda[:N]) and engine_options.
    backend: str = PolicySpec.backend
    dtype: str = PolicySpec.dtype
    device: str = PolicySpec.device
    engine_options: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4  # the programmatic teacher's trajectories take 2-4 turns
    max_new_tokens: int = 160
    max_total_tokens: int = 2048
    batch: int = 16  # trajectories in flight at once per rollout worker (LoopConfig.max_concurrent_trajectories)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", self.policy("-").dtype)  # checked and normalised by PolicySpec
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"rollout.batch must be an integer >= 1, got {self.batch!r}")

    def policy(self, model: str) -> PolicySpec:
        """The ``PolicySpec`` of ``model`` generating with these settings."""
        return PolicySpec(model=model, backend=self.backend, dtype=self.dtype, device=self.device,
                          engine_options=dict(self.engine_options))


@dataclass(frozen=True)
class EvalConfig:
    enabled: bool = True
    modes: tuple[str, ...] = ()  # () = the stage's own mode
    temperature: float = 0.0
    # Also a sampled evaluation (jobs.held_out.evaluate_sampled): k rollouts a task at
    # sample_temperature, success = the mean per-task solve rate (avg@k), with pass@k; reported as
    # mode "<mode>@<k>". 0 = off. sample_modes: () = every evaluated mode, else those of them named.
    samples: int = 0
    sample_temperature: float = 0.7
    sample_modes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.samples < 0 or self.samples == 1:
            raise ValueError(f"eval.samples must be 0 (off) or >= 2, got {self.samples}")
        if self.samples and not self.sample_temperature > 0:
            raise ValueError(f"eval.sample_temperature must be > 0 for a sampled evaluation, "
                             f"got {self.sample_temperature}")

    def sampled_modes(self, evaluated: Sequence[str]) -> list[str]:
        """The evaluated modes that also get a sampled evaluation (none when ``samples`` is 0)."""
        if not self.samples:
            return []
        return [m for m in evaluated if not self.sample_modes or m in self.sample_modes]


@dataclass(frozen=True)
class TeacherConfig:
    kind: Literal["programmatic", "openai"] = "programmatic"
    seed: int = 0
    brief: bool = False  # programmatic: short thoughts (micro-scale models, small token budgets)
    explore: int | None = None  # programmatic: cap on a trajectory's exploration calls (0: check, submit)
    base_url: str | None = None  # openai: an OpenAI-compatible endpoint
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this environment variable
    rate_per_s: float | None = None
    workers: int = 8
    cache_path: str | None = None  # default: run_dir/<stage>/teacher_cache.jsonl

    def __post_init__(self) -> None:
        if self.kind == "openai" and not (self.base_url and self.model):
            raise ValueError("teacher.kind=openai needs teacher.base_url and teacher.model")

    def build(self, stage_dir: Path) -> "Teacher":
        """The SFT stages' teacher: programmatic (default, offline) or an OpenAI-compatible endpoint
        (its key read from ``api_key_env``; its cache in ``stage_dir`` unless ``cache_path``)."""
        if self.kind == "programmatic":
            from curriculum.teachers import ProgrammaticTeacher

            return ProgrammaticTeacher(seed=self.seed, brief=self.brief, explore=self.explore)
        import os

        from curriculum.openai_teacher import OpenAIConfig, OpenAITeacher

        return OpenAITeacher(OpenAIConfig(
            base_url=self.base_url, model=self.model, api_key=os.environ.get(self.api_key_env),  # type: ignore[arg-type]
            rate_per_s=self.rate_per_s, workers=self.workers,
            cache_path=self.cache_path or str(Path(stage_dir) / "teacher_cache.jsonl")))


@dataclass(frozen=True)
class SFTSettings:
    epochs: int = 1
    batch_size: int = 8  # examples per optimizer step
    max_length: int = 2048
    # Replay (agentic SFT only): single-turn examples, stage 1's kind, written for this fraction of
    # the stage's train tasks and mixed into its data, so tool-use SFT keeps stage 1's skill.
    replay: float = 0.0
    loss: SFTConfig = field(default_factory=SFTConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-5, warmup_steps=1, total_steps=8,
                                                                   micro_batch_size=2))

    def __post_init__(self) -> None:
        if isinstance(self.replay, bool) or not isinstance(self.replay, (int, float)) \
                or not 0.0 <= self.replay <= 1.0:
            raise ValueError(f"sft.replay must be a fraction in [0, 1], got {self.replay!r}")


@dataclass(frozen=True)
class RLSettings:
    steps: int = 4
    tasks_per_step: int = 4
    group_size: int = 4  # trajectories per task (the GRPO group)
    temperature: float = 1.0
    top_p: float = 1.0
    reward: str | None = None  # None: hybrid_<mode> (routes each task type to its reward)
    updates_per_batch: int = 1
    # Dynamic sampling (DAPO): > 1 draws up to this many batches of tasks_per_step tasks per step
    # until tasks_per_step groups have unequal rewards, and trains only on such groups (a group whose
    # rewards are all equal has zero advantage: no gradient). 1 = one draw, every group trained on.
    sampling_rounds: int = 1
    # Difficulty-aware selection: >= 2 rolls out every training task this many times with the
    # starting policy before step 1 and trains only on the tasks whose samples' rewards differ (for
    # a pass/fail reward: 0 < pass rate < 1), where a group can carry a gradient
    # (jobs.train.probe_tasks). 0 = off, every task.
    probe_samples: int = 0
    # The rollouts' sampling seed (probe and steps); None = data.seed. Another value repeats a run
    # with other samples on the same training and held-out tasks: one RL row per seed.
    seed: int | None = None
    # How the learner's new weights go into the running rollout engines (sqlrl.policy.engine.UpdatePolicy):
    # drain (default: in-flight sequences finish on the old weights, exactly on-policy), abort
    # (in-flight sequences are regenerated on the new ones) or continue (they go on with the new
    # weights; tokens of an older version are masked out of the loss: sqlrl.rl.staleness).
    weight_update: str = "drain"
    loss: GRPOConfig = field(default_factory=GRPOConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, warmup_steps=0, total_steps=4,
                                                                   micro_batch_size=2))

    def __post_init__(self) -> None:
        if self.steps < 1 or self.tasks_per_step < 1 or self.group_size < 2:
            raise ValueError("rl.steps >= 1, rl.tasks_per_step >= 1 and rl.group_size >= 2 are required "
                             "(GRPO needs at least two samples per task)")
        if isinstance(self.sampling_rounds, bool) or not isinstance(self.sampling_rounds, int) \
                or self.sampling_rounds < 1:
            raise ValueError(f"rl.sampling_rounds must be an integer >= 1, got {self.sampling_rounds!r}")
        if isinstance(self.probe_samples, bool) or not isinstance(self.probe_samples, int) \
                or self.probe_samples < 0 or self.probe_samples == 1:
            raise ValueError(f"rl.probe_samples must be 0 (off) or an integer >= 2 (one sample cannot tell a "
                             f"task the model sometimes solves), got {self.probe_samples!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"rl.seed must be an integer or null (= data.seed), got {self.seed!r}")
        from sqlrl.policy.engine import UpdatePolicy

        if self.weight_update not in {p.value for p in UpdatePolicy}:
            raise ValueError(f"rl.weight_update must be one of {', '.join(p.value for p in UpdatePolicy)}, "
                             f"got {self.weight_update!r}")
        # The learner scores tokens under logits / rl.loss.temperature against the rollout's
        # log-probs, which were sampled at rl.temperature: the two must be one number (verl likewise
        # divides the actor's logits by the rollout temperature). rl.temperature is the one to set;
        # the loss follows it. An explicit, different rl.loss.temperature is a contradiction.
        if self.loss.temperature != self.temperature:
            if self.loss.temperature != GRPOConfig.temperature:
                raise ValueError(f"rl.loss.temperature ({self.loss.temperature}) must equal rl.temperature "
                                 f"({self.temperature}), the sampling temperature of the rollouts it scores; "
                                 "set rl.temperature only")
            object.__setattr__(self, "loss", replace(self.loss, temperature=self.temperature))


@dataclass(frozen=True)
class GatewaySettings:
    """``trainer: gateway``: the stage's GRPO steps (``rl.*``) run through the training gateway
    (``jobs.train_agent.gateway_steps``), rolled out by agent client processes
    (``examples.run_clients``) instead of the built-in rollout workers."""

    agent: str = "openai"  # examples.run_clients' AGENTS: openai (tool calls, one conversation) | langgraph
    clients: int = 2  # client processes
    max_tokens: int = 512  # per LLM call of the clients' agent (run_clients --max-tokens)
    rollout_deadline_s: float = 300.0  # a claimed rollout not completed by then expires
    redraws: int = 0  # replacement rollouts a group may get per step for its expired / failed ones
    train_tags: tuple[str, ...] | None = None  # None: every tagged call trains

    def __post_init__(self) -> None:
        if isinstance(self.clients, bool) or not isinstance(self.clients, int) or self.clients < 1:
            raise ValueError(f"gateway.clients must be an int >= 1, got {self.clients!r}")


@dataclass(frozen=True)
class StageConfig:
    stage: str = "stage1"  # a name in curriculum.stages.STAGES
    run_dir: str = "runs/main"
    overwrite: bool = False  # replace an existing result in run_dir/<stage> (else the job refuses)
    # continue a stage that was stopped from its newest checkpoint (checkpoint.every_steps), made
    # with this same config; none there: start at step 0
    resume: bool = False
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    eval: EvalConfig = field(default_factory=EvalConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    sft: SFTSettings = field(default_factory=SFTSettings)
    rl: RLSettings = field(default_factory=RLSettings)
    # How the stage's reward scorers score (sqlrl.rewards.RewardConfig), for its RL steps and its
    # held-out evaluation alike: format_style, sqlr1, and test-suite execution match
    # (reward.test_suite: true with reward.test_suite_dir, a folder where database variants and
    # suites are cached, e.g. <run_dir>/test_suite; docs/rewards.md). Off by default.
    reward: RewardConfig = field(default_factory=RewardConfig)
    # The update loop (a key of jobs.train.TRAINERS; checked by the stage job before any work):
    # null = the stage's own (curriculum.stages.STAGES[stage].trainer); gateway = an agentic GRPO
    # stage's steps through the training gateway with external agent clients (the `gateway:` section).
    trainer: str | None = None
    gateway: GatewaySettings = field(default_factory=GatewaySettings)

    def __post_init__(self) -> None:
        stage_spec(self.stage)  # an unknown stage is an error naming the known ones
        if self.rl.reward is not None:  # checked here, not first in a reward actor mid-stage
            from sqlrl.rewards import REWARDS

            spec = REWARDS.get(self.rl.reward)
            if spec is None:
                raise ValueError(f"rl.reward: unknown reward {self.rl.reward!r}; registered: {', '.join(REWARDS)}")
            if self.spec.trainer == "grpo" and spec.response != self.mode:
                raise ValueError(f"rl.reward: {self.rl.reward!r} scores {spec.response} responses, but "
                                 f"{self.stage} rolls out in {self.mode} mode")

    @property
    def spec(self) -> StageSpec:
        return stage_spec(self.stage)

    @property
    def mode(self) -> str:
        return self.spec.mode

    @property
    def trainer_name(self) -> str:
        """The update loop that runs: ``trainer``, else the stage's own."""
        return self.trainer or self.spec.trainer

    @property
    def reward_name(self) -> str:
        """The GRPO reward: ``rl.reward``, else the hybrid reward of the stage's mode."""
        return self.rl.reward or f"hybrid_{self.mode}"

    @property
    def stage_dir(self) -> Path:
        return Path(self.run_dir) / self.stage

    def existing_result(self) -> list[str]:
        """What a finished run of this stage left in ``stage_dir`` (``summary.json``, ``final/``):
        a job refuses to start over it unless ``overwrite`` is true."""
        return [name for name in ("summary.json", "final") if (self.stage_dir / name).exists()]

    def init_model(self) -> str:
        """The model this stage starts from (``previous`` resolved to the previous stage's output)."""
        if self.model.init != "previous":
            return self.model.init
        before = previous_stage(self.stage)
        if before is None:
            raise ValueError(f"{self.stage} has no previous stage: set model.init to a model name or folder")
        prev = Path(self.run_dir) / before / "final"
        if not (prev / "config.json").is_file():
            raise FileNotFoundError(f"model.init=previous, but {prev} holds no checkpoint: run "
                                    f"{before} first (same run_dir) or set model.init")
        return str(prev)

    def check_init_style(self) -> None:
        """``ValueError`` when the start checkpoint was trained with another schema rendering."""
        from sqlrl.agent.prompts import check_checkpoint_style
        try:
            check_checkpoint_style(self.init_model(), self.model.schema_style,
                                   "set model.schema_style={} (or unset SQLRL_SCHEMA_STYLE)")
        except ValueError as exc:
            raise ValueError(f"{self.stage}: {exc}") from None


def load_stage_config(path: str | Path | None, overrides: Sequence[str] = ()) -> StageConfig:
    return load_config(StageConfig, path, overrides)
