"""``Agent``: policy + backend + chat format + loop + session source, composed in one place.

Training (``actors/rollout.py``) and serving (``serve/``) both wrap this class; neither composes
the parts itself.

    agent = Agent.build(AgentConfig(model="tiny", loop=LoopConfig(max_turns=4)),
                        sessions=LocalSessions({"shop": {"sqlite": "sqlite:///shop.sqlite"}}),
                        schemas={"shop": schema})
    trajectories = agent.run([GenerateRequest("r1", "shop", "How many orders?")])

- ``run(items)`` takes labelled tasks or unlabelled requests (``sqlrl.agent.request``): the loop
  needs no gold answer. In agentic mode it opens one session per item from the session source
  (``SessionSource.open_many`` with one ``SessionRequest`` per item: its ``db_id``, ``dialect``,
  ``preprocess_sql`` and key), runs ``AgentLoop`` over the whole batch (one coroutine per item; a
  sync backend is wrapped in ``sqlrl.policy.batched.BatchedEngine`` for the run), and closes
  every session in ``finally``.
- ``SessionSource`` (``sqlrl.db.source``, re-exported here) is the one seam for where sessions come
  from, shared with the reward judge and the BIRD-CRITIC runner: ``LocalSessions`` opens a fresh
  ``sqlrl.db`` session per item from a catalog ``{db_id: {dialect: url}}`` (SQLite paths; for
  PostgreSQL / MariaDB the session URL of a sealed base, so each session runs in its own clone as
  its own role); ``PoolSessions`` leases from the Ray pool's client (actors/rollout.py).
- ``with_backend(b)`` gives the same agent over another backend (serve wraps its batching queue so
  concurrent requests' rounds share one generation call).

Guarantees: ``run`` never raises for an item: a refused session, a failing loop or a failing close
gives ``stop_reason="error"`` trajectories with the message (``error_trajectories``); sessions are
closed whatever happens; a request's ``schema`` overrides the source's schema for its ``db_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from sqlrl.db.source import LocalSessions, SessionRequest, SessionSource
from sqlrl.tasks.schema import DatabaseSchema

from .chat_format import ChatFormat, HFChatFormat
from .loop import AgentLoop, LoopConfig
from .trajectory import Trajectory

__all__ = ["Agent", "AgentConfig", "LocalSessions", "SessionSource", "error_trajectories"]


@dataclass(frozen=True)
class AgentConfig:
    model: str = "tiny"  # a sqlrl.policy.load MODELS name or a checkpoint folder
    dtype: str = "float32"
    backend: str = "hf"  # a sqlrl.policy.backends BACKENDS name
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    loop: LoopConfig = field(default_factory=LoopConfig)
    # where the policy's weights generate: cpu, cuda[:N], or auto = the GPU when this process sees
    # one and the backend is not vLLM (sqlrl.policy.backends.generation_device)
    device: str = "auto"

    def __post_init__(self) -> None:
        from sqlrl.policy.backends import check_device

        check_device(self.device)


def error_trajectories(items: Sequence[Any], mode: str, message: str, version: int = 0
                       ) -> list[Trajectory]:
    return [Trajectory(task_id=t.task_id, mode=mode, messages=(), token_ids=(), loss_mask=(),
                       old_logprobs=(), prompt_length=0, turns=(), n_tool_calls=0,
                       n_tool_errors=0, n_malformed=0, submitted_sql=None, stop_reason="error",
                       policy_version=version, error=message) for t in items]


class Agent:
    def __init__(self, policy: Any, backend: Any, chat_format: ChatFormat,
                 loop: LoopConfig = LoopConfig(), sessions: SessionSource | None = None,
                 schemas: Mapping[str, DatabaseSchema] | None = None, version: int = 0) -> None:
        self.policy, self.backend, self.chat_format = policy, backend, chat_format
        self.loop, self.sessions = loop, sessions
        self.schemas = dict(schemas or {})
        self.version = version
        self._batches = 0

    @classmethod
    def build(cls, config: AgentConfig, sessions: SessionSource | None = None,
              schemas: Mapping[str, DatabaseSchema] | None = None) -> "Agent":
        from sqlrl.policy.backends import make_backend, place_policy
        from sqlrl.policy.load import load_policy

        policy = place_policy(load_policy(config.model, dtype=config.dtype), config.device, config.backend)
        options = dict(config.backend_options)  # a "seed" option wins over the loop's seed
        backend = make_backend(config.backend, policy, options.pop("seed", config.loop.sampling.seed),
                               **options)
        return cls(policy, backend, HFChatFormat(policy.tokenizer), config.loop, sessions, schemas)

    def with_backend(self, backend: Any) -> "Agent":
        return Agent(self.policy, backend, self.chat_format, self.loop, self.sessions,
                     self.schemas, self.version)

    def run(self, items: Sequence[Any], *, loop: LoopConfig | None = None,
            keys: Sequence[str] | None = None) -> list[Trajectory]:
        """Roll out every item (task or request) once; one trajectory per item, in order."""
        config = loop or self.loop
        items = list(items)
        if not items:
            return []
        self._batches += 1
        keys = list(keys) if keys is not None else [f"b{self._batches}/{i}" for i in range(len(items))]
        sessions: list[Any] | None = None
        try:
            if config.mode == "agentic":
                if self.sessions is None:
                    return error_trajectories(items, config.mode, "agentic rollouts need a "
                                              "session source", self.version)
                try:
                    sessions = list(self.sessions.open_many([
                        SessionRequest(t.db_id, t.dialect, tuple(getattr(t, "preprocess_sql", ())), key=k)
                        for t, k in zip(items, keys)]))
                except Exception as exc:
                    return error_trajectories(items, config.mode,
                                              f"could not open sessions: {exc}", self.version)
            schemas = [getattr(t, "schema", None) or self.schemas.get(t.db_id) for t in items]
            try:
                return AgentLoop(items, sessions, self.backend, self.chat_format, config,
                                 schemas=schemas, policy_version=self.version,
                                 execute_many=getattr(self.sessions, "execute_many", None)).run()
            except Exception as exc:  # a bug in a layer below: typed results, never lost items
                return error_trajectories(items, config.mode, f"{type(exc).__name__}: {exc}",
                                          self.version)
        finally:
            if sessions:
                self.sessions.close_many(sessions)  # type: ignore[union-attr]

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> int:
        """Load new weights (a full state dict); returns the version now served."""
        missing, unexpected = self.policy.model.load_state_dict(dict(state_dict), strict=False)
        if missing or unexpected:
            raise ValueError(f"weights do not fit this model: missing {list(missing)[:5]}, "
                             f"unexpected {list(unexpected)[:5]}")
        load = getattr(self.backend, "load_weights", None)
        if load is not None:  # an engine with its own copy (vLLM): the model's full, checked state
            load(self.policy.model.state_dict())
        else:
            getattr(self.backend, "clear_cache", lambda: None)()  # cached KV is of the old weights
        self.version = version
        return version

    def close(self) -> None:
        """Close the backend if it holds processes (``VLLMBackend.close``); a no-op otherwise."""
        getattr(self.backend, "close", lambda: None)()

    def configured(self, **changes: Any) -> LoopConfig:
        """This agent's loop config with fields replaced (``max_turns=…``, ``sampling=…``)."""
        return replace(self.loop, **changes)
