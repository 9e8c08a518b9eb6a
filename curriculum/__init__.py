"""The training curriculum (Ray-free parts): teachers, stage data builders, task mixing.

- ``teachers``: the ``Teacher`` Protocol and ``ProgrammaticTeacher`` (ground truth, offline).
- ``openai_teacher``: ``OpenAITeacher`` over any OpenAI-compatible chat endpoint (retries, rate
  limit, resumable cache).
- ``builders``: ``build_stage1`` (reasoning SFT), ``build_stage2`` (tool-use SFT, run by
  ``AgentLoop`` on real sessions), ``build_stage3`` / ``build_stage4`` (verl parquet RL data).
- ``mixing``: ``MixtureConfig``, ``mix`` (Zeno = debugging + text-to-SQL, Talon = debugging).

See docs/curriculum.md. Nothing here imports ray; the curriculum jobs (``jobs/``) do.
"""

from .builders import (BuildReport, Outcome, build_rl_data, build_stage1, build_stage2,
                       build_stage3, build_stage4)
from .mixing import TALON, ZENO, MixtureConfig, MixtureError, allocate, mix, mixtures_from_config
from .openai_teacher import OpenAIConfig, OpenAITeacher, TeacherError
from .teachers import ProgrammaticTeacher, Teacher

__all__ = ["BuildReport", "MixtureConfig", "MixtureError", "OpenAIConfig", "OpenAITeacher",
           "Outcome", "ProgrammaticTeacher", "TALON", "Teacher", "TeacherError", "ZENO", "allocate",
           "build_rl_data", "build_stage1", "build_stage2", "build_stage3", "build_stage4", "mix",
           "mixtures_from_config"]
