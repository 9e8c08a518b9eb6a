"""The serve application's configuration: models, databases, limits and API keys (frozen dataclasses).

``ServeConfig`` mirrors the ``args:`` of the application in ``serve/config.yaml`` key for key;
``load_serve_config(mapping)`` builds it with ``sqlrl.config``'s strict checks (unknown keys and
wrong types are errors naming the dotted key).

- ``models``: the registry of served models, name -> ``ModelSpec``: its ``policy`` is the one
  policy spec training uses (``sqlrl.policy.spec.PolicySpec``: ``model`` -- a checkpoint folder the
  curriculum writes, ``<run_dir>/<stage>/final``, or a named model such as ``tiny`` --, ``backend``
  -- an engine: auto, hf, vllm, scripted --, ``dtype``, ``device``, ``engine_options``, with the
  same defaults and spellings as a stage config's ``model`` and ``rollout`` keys); beside it the
  serving-only knobs: the engine's running-batch bound and the queue sizes, replicas, CPUs per
  replica (unset = a share of the cluster, ``serve/resources.py``), GPUs, torch threads. Adding a
  served model is one entry here, nothing else. The keys of the spec before it held a
  ``PolicySpec`` (``path``, ``backend``, ``backend_options``, ``dtype``, ``device``) are errors
  naming the key to write instead (``policy.model``, ...).
- ``databases``: name -> ``DatabaseSpec``: a SQLite path, or for PostgreSQL / MariaDB the session
  URL of a sealed base (``sqlrl.db.provisioning.provision.session_url``: every session gets its own clone and
  role). Clients name a database; they never pass a path or DSN.
- ``sql_models``: which model answers ``/v1/sql/debug`` (Talon) and ``/v1/sql/generate`` (Zeno).
- ``colocate``: the models run inside the ingress replicas instead of behind deployment handles
  (one Ray hop less per request; per-model replicas and GPUs then do not apply; the queue limit
  does: ``ModelSpec.in_flight_limit``, enforced by the ingress).
- ``limits`` and ``auth``: what a public endpoint needs (see ``serve/limits.py``).

Guarantees: ``__post_init__`` rejects inconsistent settings (``max_ongoing_requests`` below the
batch size, no models at all, a backend serving cannot run, an ``engine_options`` key that
``max_batch_size`` sets). An ``sql_models`` entry naming a model that is not served leaves
that endpoint answering 404 ``model_not_found``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from sqlrl.config import from_mapping, rename_keys
from sqlrl.policy.spec import PolicySpec


@dataclass(frozen=True)
class ModelSpec:
    policy: PolicySpec  # model, backend, dtype, device, engine_options: as training's (module doc)
    max_batch_size: int = 16  # sequences the replica's engine runs at once (hf max_batch, vLLM max_num_seqs)
    max_ongoing_requests: int = 32  # per replica; >= max_batch_size so the running batch can fill
    max_queued_requests: int = 64  # waiting beyond the replicas' slots; more get 503 (-1: no limit)
    num_replicas: int = 1
    num_cpus: float | None = None  # per replica; None: a share of the cluster (serve/resources.py)
    num_gpus: float = 0.0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        from .engines import KINDS, check_served

        if not isinstance(self.policy, PolicySpec):
            raise ValueError(f"ModelSpec.policy must be a PolicySpec, got {type(self.policy).__name__}")
        check_served(self.policy.backend)
        bound = sorted({k.batch_option for k in KINDS.values() if k.batch_option} & set(self.policy.engine_options))
        if bound:
            raise ValueError(f"policy.engine_options.{bound[0]}: serving sets it from max_batch_size; "
                             "set max_batch_size instead")
        if self.max_batch_size < 1 or self.num_replicas < 1:
            raise ValueError("max_batch_size and num_replicas must be >= 1")
        if self.max_ongoing_requests < self.max_batch_size:
            raise ValueError(f"max_ongoing_requests ({self.max_ongoing_requests}) must be >= "
                             f"max_batch_size ({self.max_batch_size}) or the running batch never fills")
        if self.num_cpus is not None and self.num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0 (or unset), got {self.num_cpus}")
        if self.max_queued_requests < -1:
            raise ValueError(f"max_queued_requests must be >= 0, or -1 for no limit; got "
                             f"{self.max_queued_requests}")

    def in_flight_limit(self, colocate: bool) -> int | None:
        """Requests one ingress replica lets in at once: every replica slot plus the queue
        (colocated: the ingress replica's own model). None: no limit."""
        if self.max_queued_requests < 0:
            return None
        replicas = 1 if colocate else self.num_replicas
        return self.max_ongoing_requests * replicas + self.max_queued_requests


# the keys of ModelSpec before its policy part was a PolicySpec
rename_keys(ModelSpec, {"path": "policy.model", "backend": "policy.backend", "backend_options": "policy.engine_options",
                        "dtype": "policy.dtype", "device": "policy.device"})


@dataclass(frozen=True)
class DatabaseSpec:
    url: str  # sqlite:///path.sqlite, or the session URL of a sealed PostgreSQL/MariaDB base
    schema_sqlite: str | None = None  # a SQLite copy to read the schema from (server bases)


@dataclass(frozen=True)
class LimitsSpec:
    max_body_bytes: int = 1_000_000  # 413 above
    max_tokens: int = 512  # max_tokens is clamped to this
    default_max_tokens: int = 256
    max_n: int = 4
    max_samples: int = 8  # /v1/sql/*: self-consistency samples
    max_turns: int = 8  # /v1/sql/*: agent turns
    max_total_tokens: int = 8192
    request_timeout_s: float = 120.0  # end to end; 504 after
    rate_limit_per_minute: float = 600.0  # per API key (token bucket); 0 = none
    rate_limit_burst: int = 60
    sql_timeout_s: float = 5.0  # per execute_sql call (sqlrl.db Limits)
    sql_max_rows: int = 1_000
    preview_rows: int = 20  # rows of the final SQL's result returned


@dataclass(frozen=True)
class AuthSpec:
    api_keys: tuple[str, ...] = ()
    api_keys_env: str = "SQLRL_SERVE_API_KEYS"  # comma-separated keys, added to api_keys
    required: bool = True  # False: no key needed (local experiments only)

    def keys(self) -> frozenset[str]:
        env = os.environ.get(self.api_keys_env, "") if self.api_keys_env else ""
        return frozenset(k for k in (*self.api_keys, *env.split(",")) if k.strip())


@dataclass(frozen=True)
class ServeConfig:
    models: dict[str, ModelSpec] = field(default_factory=dict)
    databases: dict[str, DatabaseSpec] = field(default_factory=dict)
    sql_models: dict[str, str] = field(default_factory=lambda: {"debug": "talon",
                                                                "generate": "zeno"})
    limits: LimitsSpec = field(default_factory=LimitsSpec)
    auth: AuthSpec = field(default_factory=AuthSpec)
    # True: every ingress replica holds the models itself (no handle hop: lower latency; for small
    # models on one machine). False: one ModelServer deployment per model (own replicas, GPUs and
    # replica counts -- num_replicas and num_gpus apply only here).
    colocate: bool = False
    ingress_num_cpus: float = 0.25  # per ingress replica (it parses and forwards; serve/resources.py)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("serve config: no models (give models: {talon: {policy: {model: ...}}})")
        bad = set(self.sql_models) - {"debug", "generate"}
        if bad:
            raise ValueError(f"sql_models keys must be 'debug'/'generate', got {sorted(bad)}")


def load_serve_config(data: Mapping[str, Any]) -> ServeConfig:
    return from_mapping(ServeConfig, data)
