"""``Agent``: policy + backend + chat format + loop + session source, composed in one place.

Rollout workers (``actors/rollout.py``) wrap this class; they do not compose the parts themselves.

    agent = Agent.build(AgentConfig(PolicySpec("tiny"), loop=LoopConfig(max_turns=4)),
                        sessions=LocalSessions({"shop": {"sqlite": "sqlite:///shop.sqlite"}}),
                        schemas={"shop": schema})
    trajectories = agent.run([GenerateRequest("r1", "shop", "How many orders?")])

- ``build(AgentConfig(policy=PolicySpec(...), loop=...))`` loads the policy and makes ONE engine
  over it (``make_engine(policy.backend)``), kept for the agent's life; ``update_weights`` loads
  new weights into that running engine under an ``UpdatePolicy``; ``close`` closes it.
- ``run(items)`` takes labelled tasks or unlabelled requests (``sqlrl.agent.request``): the loop
  needs no gold answer. It is ``sqlrl.agent.rollouts.roll_out`` on the agent's engine (a sync
  backend given to the constructor is wrapped for the run): every item a coroutine, at most
  ``loop.max_concurrent_trajectories`` at once, in agentic mode each leasing its own session from
  the source (one ``SessionRequest``: its ``db_id``, ``dialect``, ``preprocess_sql`` and key) as
  it starts and closing it as it ends.
- ``SessionSource`` (``sqlrl.db.source``, re-exported here) is the one seam for where sessions come
  from, shared with the reward judge and the BIRD-CRITIC runner: ``LocalSessions`` opens a fresh
  ``sqlrl.db`` session per item from a catalog ``{db_id: {dialect: url}}`` (SQLite paths; for
  PostgreSQL / MariaDB the session URL of a sealed base, so each session runs in its own clone as
  its own role); ``PoolSessions`` leases from the Ray pool's client (actors/rollout.py).
- ``with_backend(b)`` gives the same agent over another engine or backend.
- ``load_checkpoint(spec)`` serves another checkpoint of the same model family from the RUNNING
  engine (no new engine: a vLLM engine costs tens of seconds to start on CPU): its weights go in
  through ``update_weights`` (``DRAIN``), and the agent reports policy version 0 again, as a fresh
  agent on that checkpoint would. A checkpoint that cannot be served so -- another tokenizer,
  other end tokens, another architecture or other tensor shapes -- is a ``ValueError`` naming the
  difference, raised before anything is loaded (``family_mismatch``).

Guarantees: ``run`` never raises for an item: a refused session or a failing loop gives
``stop_reason="error"`` trajectories with the message (``error_trajectories``); sessions are
closed whatever happens; a request's ``schema`` overrides the source's schema for its ``db_id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from sqlrl.db.source import LocalSessions, SessionSource
from sqlrl.tasks.schema import DatabaseSchema

from .chat_format import ChatFormat, HFChatFormat
from sqlrl.policy.engine import AsyncEngine, UpdatePolicy, run_sync
from sqlrl.policy.spec import PolicySpec

from .loop import LoopConfig
from .rollouts import error_trajectories, roll_out
from .trajectory import Trajectory

__all__ = ["Agent", "AgentConfig", "LocalSessions", "SessionSource", "error_trajectories", "family_mismatch"]

# config.json keys that name or describe a checkpoint rather than the computation
_CONFIG_NOISE = frozenset({"_name_or_path", "torch_dtype", "dtype", "transformers_version", "architectures"})


def family_mismatch(a: Any, b: Any) -> str | None:
    """Why loaded policy ``b``'s weights cannot simply replace ``a``'s in a running engine (None:
    they can): another vocabulary, special tokens, chat template or end tokens (the prompts and
    their ids would change), or another model configuration."""
    ta, tb = a.tokenizer, b.tokenizer
    if ta.get_vocab() != tb.get_vocab() or ta.all_special_tokens != tb.all_special_tokens:
        return "another tokenizer (vocabulary or special tokens)"
    if ta.chat_template != tb.chat_template:
        return "another chat template"
    if tuple(a.eos_token_ids) != tuple(b.eos_token_ids) or a.pad_token_id != b.pad_token_id:
        return f"other end/pad tokens ({a.eos_token_ids}/{a.pad_token_id} vs {b.eos_token_ids}/{b.pad_token_id})"
    ca, cb = ({k: v for k, v in m.config.to_dict().items() if k not in _CONFIG_NOISE} for m in (a.model, b.model))
    if ca != cb:
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        return f"another model configuration ({', '.join(keys[:5])})"
    return None


@dataclass(frozen=True)
class AgentConfig:
    policy: PolicySpec = field(default_factory=PolicySpec)  # model, backend (engine), dtype, device, options
    loop: LoopConfig = field(default_factory=LoopConfig)


class Agent:
    def __init__(self, policy: Any, backend: Any, chat_format: ChatFormat,
                 loop: LoopConfig = LoopConfig(), sessions: SessionSource | None = None,
                 schemas: Mapping[str, DatabaseSchema] | None = None, version: int = 0) -> None:
        self.policy, self.backend, self.chat_format = policy, backend, chat_format
        self.loop, self.sessions = loop, sessions
        self.schemas = dict(schemas or {})
        self.version = version
        # the engine's weight versions -> the versions this agent reports (the learner's numbering)
        self.version_map: dict[int, int] = (
            {backend.policy_version: version} if isinstance(backend, AsyncEngine) else {})
        self._batches = 0

    @classmethod
    def build(cls, config: AgentConfig, sessions: SessionSource | None = None,
              schemas: Mapping[str, DatabaseSchema] | None = None) -> "Agent":
        """The policy loaded and placed, and ONE engine over it (``PolicySpec.build``: an engine
        option ``seed`` wins over the loop's sampling seed)."""
        policy, engine = config.policy.build(seed=config.loop.sampling.seed)
        return cls(policy, engine, HFChatFormat(policy.tokenizer), config.loop, sessions, schemas)

    def with_backend(self, backend: Any) -> "Agent":
        return Agent(self.policy, backend, self.chat_format, self.loop, self.sessions,
                     self.schemas, self.version)

    def run(self, items: Sequence[Any], *, loop: LoopConfig | None = None,
            keys: Sequence[str] | None = None, seed_indexes: Sequence[int] | None = None) -> list[Trajectory]:
        """Roll out every item (task or request) once; one trajectory per item, in order
        (``sqlrl.agent.rollouts.roll_out``: sessions leased per item as it starts)."""
        items = list(items)
        if not items:
            return []
        self._batches += 1
        keys = list(keys) if keys is not None else [f"b{self._batches}/{i}" for i in range(len(items))]
        return roll_out(self.backend, self.chat_format, items, loop or self.loop, sessions=self.sessions,
                        schemas=self.schemas, keys=keys, seed_indexes=seed_indexes, version=self.version,
                        versions=self.version_map)

    def update_weights(self, state_dict: Mapping[str, Any], version: int,
                       policy: UpdatePolicy = UpdatePolicy.DRAIN) -> int:
        """Load new weights (a full state dict) into the running engine under ``policy``; returns the
        version now served. Weights that do not fit the model raise ``ValueError``, nothing loaded."""
        if isinstance(self.backend, AsyncEngine):
            self.version_map[run_sync(self.backend.update_weights(state_dict, policy=UpdatePolicy(policy)))] = version
            self.version = version
            return version
        missing, unexpected = self.policy.model.load_state_dict(dict(state_dict), strict=False)  # a batch backend
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

    def load_checkpoint(self, spec: PolicySpec) -> int:
        """Serve ``spec.model``'s weights (loaded in ``spec.dtype``) from the running engine; returns
        the version now reported (0). ``ValueError`` (nothing loaded) when it is not of this agent's
        model family (module docstring)."""
        from sqlrl.policy.load import load_policy

        new = load_policy(spec.model, dtype=spec.dtype)
        problem = family_mismatch(self.policy, new)
        if problem:
            raise ValueError(f"{spec.model} cannot be served by this agent's engine: {problem}")
        self.update_weights(new.model.state_dict(), 0, UpdatePolicy.DRAIN)
        # the engine's own copy now holds the new weights; the agent names the checkpoint it serves
        self.policy = replace(self.policy, name=new.name, path=new.path)
        return self.version

    def close(self) -> None:
        """Close the engine (a vLLM engine's processes, an HF engine's scheduler thread) or a backend
        that holds processes (``VLLMBackend.close``)."""
        if isinstance(self.backend, AsyncEngine):
            run_sync(self.backend.close())
        else:
            getattr(self.backend, "close", lambda: None)()

    def configured(self, **changes: Any) -> LoopConfig:
        """This agent's loop config with fields replaced (``max_turns=…``, ``sampling=…``)."""
        return replace(self.loop, **changes)
