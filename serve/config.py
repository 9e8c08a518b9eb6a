"""The serve application's configuration: models, databases, limits and API keys (frozen dataclasses).

``ServeConfig`` mirrors the ``args:`` of the application in ``serve/config.yaml`` key for key;
``load_serve_config(mapping)`` builds it with ``sqlrl.config``'s strict checks (unknown keys and
wrong types are errors naming the dotted key).

- ``models``: the registry of served models, name -> ``ModelSpec`` (a checkpoint folder the
  curriculum writes, ``<run_dir>/<stage>/final``, or a named model such as ``tiny``; the backend
  name (``serve/engines.py``: hf, vllm, auto, scripted); the engine's running-batch bound and the
  queue sizes; CPUs per replica, unset = a share of the cluster, ``serve/resources.py``). Adding a
  served model is one entry here, nothing else.
- ``databases``: name -> ``DatabaseSpec``: a SQLite path, or for PostgreSQL / MariaDB the session
  URL of a sealed base (``sqlrl.db.provisioning.provision.session_url``: every session gets its own clone and
  role). Clients name a database; they never pass a path or DSN.
- ``sql_models``: which model answers ``/v1/sql/debug`` (Talon) and ``/v1/sql/generate`` (Zeno).
- ``colocate``: the models run inside the ingress replicas instead of behind deployment handles
  (one Ray hop less per request; per-model replicas and GPUs then do not apply; the queue limit
  does: ``ModelSpec.in_flight_limit``, enforced by the ingress).
- ``limits`` and ``auth``: what a public endpoint needs (see ``serve/limits.py``).

Guarantees: ``__post_init__`` rejects inconsistent settings (``max_ongoing_requests`` below the
batch size, no models at all). An ``sql_models`` entry naming a model that is not served leaves
that endpoint answering 404 ``model_not_found``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from sqlrl.config import from_mapping


@dataclass(frozen=True)
class ModelSpec:
    path: str  # checkpoint folder (<run_dir>/<stage>/final) or a sqlrl.policy.load MODELS name
    backend: str = "hf"  # "hf" (CPU default), "vllm" (GPU, unverified here), "scripted" (tests)
    backend_options: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    max_batch_size: int = 16  # sequences the replica's engine runs at once (hf max_batch, vLLM max_num_seqs)
    max_ongoing_requests: int = 32  # per replica; >= max_batch_size so the running batch can fill
    max_queued_requests: int = 64  # waiting beyond the replicas' slots; more get 503 (-1: no limit)
    num_replicas: int = 1
    num_cpus: float | None = None  # per replica; None: a share of the cluster (serve/resources.py)
    num_gpus: float = 0.0
    torch_threads: int = 1
    # where hf generation runs: auto = the GPU when the replica sees one (num_gpus > 0) and the
    # backend is not vLLM, else the CPU; or cpu, cuda, cuda:N (sqlrl.policy.backends.generation_device)
    device: str = "auto"

    def __post_init__(self) -> None:
        from sqlrl.policy.backends import check_device

        check_device(self.device)
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
            raise ValueError("serve config: no models (give models: {talon: {path: ...}})")
        bad = set(self.sql_models) - {"debug", "generate"}
        if bad:
            raise ValueError(f"sql_models keys must be 'debug'/'generate', got {sorted(bad)}")


def load_serve_config(data: Mapping[str, Any]) -> ServeConfig:
    return from_mapping(ServeConfig, data)
