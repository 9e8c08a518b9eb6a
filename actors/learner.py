"""The learner group: N FSDP2 rank actors (or one in-process ``Learner``) behind one driver API
(thin: the engine is ``sqlrl.learn.engine``, checkpoints ``sqlrl.learn.checkpoint``).

- ``LearnerGroup(model, optim, in_process=True)`` runs one unsharded ``Learner`` in this process
  (no Ray). Otherwise ``n >= 1`` starts ``n`` Ray actors (``actors.group.ActorGroup``;
  ``num_cpus``/``num_gpus``/custom ``resources`` each) that join one process group (gloo on CPU,
  NCCL on GPU: ``backend="auto"``) on a port of ``master_addr`` the driver picked, and shard the
  model with FSDP2 (``n=1`` too: a one-rank FSDP group). Ranks are never restarted: a
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

from actors.group import DIED, RAISED, TIMEOUT, ActorGroup, Failed
from sqlrl.learn.optim import OptimConfig

GRACE_S = 10.0  # after one rank raised, how long the others get to raise the same error


class LearnerGroupError(RuntimeError):
    """The learner group is broken (a rank died or hung); restart it from the last checkpoint."""


class LearnerRank:
    """One rank: a ``Learner`` in a Ray actor."""

    def __init__(self, model: str, optim: OptimConfig, dist: Any, options: dict) -> None:
        from sqlrl.learn.engine import Learner

        # dist None: the in-process learner, unsharded; else one rank of an FSDP group (n=1 too)
        self.learner = Learner(model, optim, dist=dist, shard=None if dist is None else True, **options)

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
    def __init__(self, model: str | os.PathLike = "tiny", optim: OptimConfig | None = None, n: int = 1, *,
                 in_process: bool = False, mixed_precision: str = "float32", reference: bool = False,
                 seed: int = 0, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 resources: Mapping[str, float] | None = None, master_addr: str = "127.0.0.1",
                 backend: str = "auto", timeout_s: float = 1800.0) -> None:
        from sqlrl.learn.fsdp import precision_name
        from sqlrl.policy.load import resolve_path

        if not in_process and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n (learner ranks) must be an int >= 1, got {n!r} "
                             "(in_process=True runs one unsharded learner in this process)")
        mixed_precision = precision_name(mixed_precision)  # fail here, not in n actors
        model = resolve_path(model)  # fail here, not in n actors (FileNotFoundError naming the models)
        self.n = 1 if in_process else n
        self.timeout_s = timeout_s
        self.optim = optim or OptimConfig()
        self._state: tuple[int, Any] | None = None
        self.version = 0
        options = {"mixed_precision": mixed_precision, "reference": reference, "seed": seed}
        self.ranks = ActorGroup(LearnerRank, in_process=in_process, num_cpus=num_cpus, num_gpus=num_gpus,
                                resources=resources, max_restarts=0)
        if in_process:
            self.ranks.add({0: (os.fspath(model), self.optim, None, options)})
        else:
            from sqlrl.learn.fsdp import DistConfig, free_port

            port = free_port(master_addr)
            self.ranks.add({r: (os.fspath(model), self.optim,
                                DistConfig(rank=r, world_size=n, master_addr=master_addr, master_port=port,
                                           backend=backend, timeout_s=timeout_s), options)
                            for r in range(n)})
        self.info = self._call(LearnerRank.ready)

    # ------------------------------------------------------------------------------------ calls
    def _call(self, method: Any, per_rank_args: Sequence[tuple] | None = None, *args: Any) -> list[Any]:
        """Run ``method`` on every rank; see the module doc for how failures surface."""
        if not len(self.ranks):
            raise LearnerGroupError("this learner group is stopped (a rank failed earlier, or shutdown())")
        name = method.__name__
        answers = self.ranks.fan_out(method, {r: per_rank_args[r] if per_rank_args else args
                                              for r in self.ranks.keys()},
                                     timeout_s=self.timeout_s, settle_s=GRACE_S)
        failures = [v for v in answers.values() if isinstance(v, Failed)]
        dead = [f"learner rank {v.member} died during {name}(): {v.message}" for v in failures if v.kind == DIED]
        late = [v.member for v in failures if v.kind == TIMEOUT]
        errors = [v.error for v in failures if v.kind == RAISED]
        if dead:
            self._stop("; ".join(dead))
        if late:
            self._stop(f"learner rank(s) {late} did not finish {name}() "
                       + ("after another rank failed" if errors else f"within {self.timeout_s} s"))
        if errors:
            raise errors[0]  # type: ignore[misc]
        return list(answers.values())

    def _stop(self, message: str) -> None:
        self.ranks.stop()
        raise LearnerGroupError(f"{message}; the learner group is stopped (restart it from the last checkpoint)")

    # -------------------------------------------------------------------------------------- API
    @property
    def world_size(self) -> int:
        return self.n

    def step(self, batch: Any, loss: str, loss_cfg: Any) -> dict[str, float]:
        if self.ranks.in_process:
            metrics = self._call(LearnerRank.step, None, batch, loss, loss_cfg)[0]
        else:
            metrics = self._call(LearnerRank.step, [(batch.shard(r, self.n), loss, loss_cfg)
                                                    for r in range(self.n)])[0]
        self.version = int(metrics["version"])
        return metrics

    def save(self, directory: str | os.PathLike, *, overwrite: bool = False) -> str:
        return self._call(LearnerRank.save, None, os.fspath(directory), overwrite)[0]

    def load(self, directory: str | os.PathLike) -> int:
        step = self._call(LearnerRank.load, None, os.fspath(directory))[0]
        self.version, self._state = step, None
        return step

    def state_dict(self) -> dict[str, Any]:
        """The full fp32 CPU weights of the current version, in this process."""
        if self.ranks.in_process:
            return self._call(LearnerRank.full_state_dict)[0]
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
            if self.ranks.in_process:
                ref = ray.put(self.state_dict())
            else:  # a collective on every rank; only rank 0 returns the weights (left in the store)
                refs = [self.ranks.send(r, LearnerRank.full_state_dict) for r in self.ranks.keys()]
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

    def sync_to(self, rollout_group: Any, policy: Any = "drain") -> tuple[int, float]:
        """Push the current weights into a ``RolloutGroup``'s running engines under ``policy`` (an
        ``UpdatePolicy`` or its name: drain, abort, continue); returns (version, seconds)."""
        t0 = time.perf_counter()
        remote = not rollout_group.workers.in_process  # Ray workers: hand over the ref, no re-put
        rollout_group.update_weights(self.state_dict_ref() if remote else self.state_dict(), self.version,
                                     policy=policy)
        return self.version, time.perf_counter() - t0

    def shutdown(self) -> None:
        if len(self.ranks) and not self.ranks.in_process:
            self.ranks.call_all(LearnerRank.shutdown, timeout_s=30)
        self.ranks.stop()
