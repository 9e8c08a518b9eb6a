"""The learner group: N FSDP2 rank actors (or one in-process ``Learner``) behind one driver API
(thin: the engine is ``sqlrl.learn.engine``, checkpoints ``sqlrl.learn.checkpoint``).

- ``LearnerGroup(model, optim, n=0)`` runs one unsharded ``Learner`` in this process (no Ray).
  ``n >= 1`` starts ``n`` Ray actors (``num_cpus``/``num_gpus``/custom ``resources`` each) that join one process group
  (gloo on CPU, NCCL on GPU: ``backend="auto"``) on a port of ``master_addr`` the driver picked, and
  shard the model with FSDP2 (``n=1`` too: a one-rank FSDP group). Ranks are never restarted: a
  process group cannot take a new member.
- ``step(batch, loss, loss_cfg)`` gives rank *r* the rows ``batch.shard(r, n)`` (a batch with fewer
  rows than ranks is a ``ValueError`` before anything runs) and returns rank 0's metrics, which
  are already reduced over all ranks. The update equals the single-process full-batch update.
- ``save(dir)`` / ``load(dir)`` are ``save_checkpoint`` / ``load_checkpoint`` on every rank.
- ``state_dict_ref()`` is an ObjectRef of the full fp32 CPU state dict of the current version (rank
  0's return value, stored once in the object store and reused until the next update).
  ``sync_to(rollout_group)`` sends it through ``RolloutGroup.update_weights(state_dict, version)``
  and returns ``(version, seconds)``; every trajectory then carries that ``policy_version``.
- Failures: a rank that dies (or does not answer within ``timeout_s``) stops the whole group and
  raises ``LearnerGroupError`` naming the rank — the others would wait in a collective forever.
  An exception that every rank raises alike (bad input: ``ValueError``, ``CheckpointError``) is
  re-raised as such and the group stays usable.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

from sqlrl.learn.optim import OptimConfig

GRACE_S = 10.0  # after one rank raised, how long the others get to raise the same error


class LearnerGroupError(RuntimeError):
    """The learner group is broken (a rank died or hung); restart it from the last checkpoint."""


class LearnerRank:
    """One rank: a ``Learner`` in a Ray actor."""

    def __init__(self, model: str, optim: OptimConfig, dist: Any, options: dict) -> None:
        from sqlrl.learn.engine import Learner

        self.learner = Learner(model, optim, dist=dist, shard=True, **options)

    def ready(self) -> dict[str, Any]:
        import torch

        return {"rank": self.learner.rank, "device": self.learner.device, "threads": torch.get_num_threads()}

    def step(self, batch: Any, loss: str, loss_cfg: Any) -> dict[str, float]:
        return self.learner.step(batch, loss, loss_cfg)

    def full_state_dict(self) -> dict[str, Any] | None:
        state = self.learner.full_state_dict()
        return state if self.learner.rank == 0 else None

    def save(self, directory: str, overwrite: bool) -> str:
        from sqlrl.learn.checkpoint import save_checkpoint

        return str(save_checkpoint(self.learner, directory, overwrite=overwrite))

    def load(self, directory: str) -> int:
        from sqlrl.learn.checkpoint import load_checkpoint

        return load_checkpoint(self.learner, directory)

    def version(self) -> int:
        return self.learner.version

    def shutdown(self) -> None:
        self.learner.shutdown()


class LearnerGroup:
    def __init__(self, model: str | os.PathLike = "tiny", optim: OptimConfig | None = None, n: int = 0, *,
                 mixed_precision: str = "fp32", reference: bool = False, seed: int = 0,
                 num_cpus: float = 1.0, num_gpus: float = 0.0, resources: Mapping[str, float] | None = None,
                 master_addr: str = "127.0.0.1",
                 backend: str = "auto", timeout_s: float = 1800.0) -> None:
        from sqlrl.learn.fsdp import MIXED_PRECISION
        from sqlrl.policy.load import resolve_path

        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n (learner ranks) must be an int >= 0, got {n!r}")
        if mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"unknown mixed_precision {mixed_precision!r}; known: {', '.join(MIXED_PRECISION)}")
        model = resolve_path(model)  # fail here, not in n actors (FileNotFoundError naming the models)
        self.n, self.timeout_s = n, timeout_s
        self.optim = optim or OptimConfig()
        self._state: tuple[int, Any] | None = None
        self.version = 0
        options = {"mixed_precision": mixed_precision, "reference": reference, "seed": seed}
        if n == 0:
            from sqlrl.learn.engine import Learner

            self._local: Any = Learner(os.fspath(model), self.optim, **options)
            self.ranks: list[Any] = []
            import torch

            self.info = [{"rank": 0, "device": self._local.device, "threads": torch.get_num_threads()}]
            return
        import ray

        from sqlrl.learn.fsdp import DistConfig, free_port

        port = free_port(master_addr)
        remote = ray.remote(LearnerRank).options(num_cpus=num_cpus, num_gpus=num_gpus,
                                                 resources=dict(resources or {}) or None, max_restarts=0,
                                                 max_task_retries=0)
        self.ranks = [remote.remote(os.fspath(model), self.optim,
                                    DistConfig(rank=r, world_size=n, master_addr=master_addr,
                                               master_port=port, backend=backend, timeout_s=timeout_s),
                                    options) for r in range(n)]
        self._local = None
        self.info = self._call("ready")

    # ------------------------------------------------------------------------------------ calls
    def _call(self, method: str, per_rank_args: Sequence[tuple] | None = None, *args: Any) -> list[Any]:
        """Run ``method`` on every rank; see the module doc for how failures surface."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if not self.ranks:
            raise LearnerGroupError("this learner group is stopped (a rank failed earlier, or shutdown())")
        arg_lists = per_rank_args or [args] * len(self.ranks)
        refs = [getattr(a, method).remote(*a_args) for a, a_args in zip(self.ranks, arg_lists)]
        deadline = time.monotonic() + self.timeout_s
        pending, failed_at = list(refs), None
        while pending:
            limit = deadline if failed_at is None else min(deadline, failed_at + GRACE_S)
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, limit - time.monotonic()))
            if not ready:
                break
            if failed_at is None:
                try:
                    ray.get(ready[0], timeout=0)
                except (RayActorError, GetTimeoutError):
                    break
                except Exception:
                    failed_at = time.monotonic()
        values, errors, dead, late = [], [], [], []
        for r, ref in enumerate(refs):
            try:
                values.append(ray.get(ref, timeout=0))
            except RayActorError as exc:
                dead.append(f"learner rank {r} died during {method}(): {exc}")
            except GetTimeoutError:
                late.append(r)
            except Exception as exc:
                errors.append(exc)
        if dead:
            self._stop("; ".join(dead))
        if late:
            self._stop(f"learner rank(s) {late} did not finish {method}() "
                       + ("after another rank failed" if failed_at else f"within {self.timeout_s} s"))
        if errors:
            raise errors[0]
        return values

    def _stop(self, message: str) -> None:
        import ray

        for a in self.ranks:
            ray.kill(a, no_restart=True)
        self.ranks = []
        raise LearnerGroupError(f"{message}; the learner group is stopped (restart it from the last checkpoint)")

    # -------------------------------------------------------------------------------------- API
    @property
    def world_size(self) -> int:
        return max(1, self.n)

    def step(self, batch: Any, loss: str, loss_cfg: Any) -> dict[str, float]:
        if self._local is not None:
            metrics = self._local.step(batch, loss, loss_cfg)
        else:
            shards = [(batch.shard(r, self.n), loss, loss_cfg) for r in range(self.n)]
            metrics = self._call("step", shards)[0]
        self.version = int(metrics["version"])
        return metrics

    def save(self, directory: str | os.PathLike, *, overwrite: bool = False) -> str:
        if self._local is not None:
            from sqlrl.learn.checkpoint import save_checkpoint

            return str(save_checkpoint(self._local, directory, overwrite=overwrite))
        return self._call("save", None, os.fspath(directory), overwrite)[0]

    def load(self, directory: str | os.PathLike) -> int:
        if self._local is not None:
            from sqlrl.learn.checkpoint import load_checkpoint

            step = load_checkpoint(self._local, directory)
        else:
            step = self._call("load", None, os.fspath(directory))[0]
        self.version, self._state = step, None
        return step

    def state_dict(self) -> dict[str, Any]:
        """The full fp32 CPU weights of the current version, in this process."""
        if self._local is not None:
            return self._local.full_state_dict()
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(self.state_dict_ref(), timeout=self.timeout_s)
        except (RayActorError, GetTimeoutError) as exc:
            self._stop(f"learner rank 0 failed in full_state_dict(): {exc}")
            raise  # unreachable: _stop raises

    def state_dict_ref(self) -> Any:
        import ray
        from ray.exceptions import RayActorError

        if self._state is None or self._state[0] != self.version:
            if self._local is not None:
                ref = ray.put(self._local.full_state_dict())
            else:  # a collective on every rank; only rank 0 returns the weights (left in the store)
                refs = [a.full_state_dict.remote() for a in self.ranks]
                _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s, fetch_local=False)
                if pending:
                    self._stop(f"learner rank(s) {[refs.index(p) for p in pending]} did not finish "
                               f"full_state_dict() within {self.timeout_s} s")
                for r, other in enumerate(refs[1:], 1):
                    try:
                        ray.get(other)
                    except RayActorError as exc:
                        self._stop(f"learner rank {r} died during full_state_dict(): {exc}")
                ref = refs[0]
            self._state = (self.version, ref)
        return self._state[1]

    def sync_to(self, rollout_group: Any) -> tuple[int, float]:
        """Push the current weights to a ``RolloutGroup``; returns (version, seconds)."""
        t0 = time.perf_counter()
        remote = bool(getattr(rollout_group, "workers", None))  # Ray workers: hand over the ref, no re-put
        rollout_group.update_weights(self.state_dict_ref() if remote else self.state_dict(), self.version)
        return self.version, time.perf_counter() - t0

    def shutdown(self) -> None:
        if self._local is not None:
            self._local = None
            return
        if self.ranks:
            import ray

            try:
                ray.get([a.shutdown.remote() for a in self.ranks], timeout=30)
            except Exception:
                pass
            for a in self.ranks:
                ray.kill(a, no_restart=True)
            self.ranks = []
