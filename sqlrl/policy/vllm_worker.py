"""The vLLM worker extension that loads the learner's weights into a running engine.

vLLM imports this class by its qualified name inside every engine worker process
(``LLM(worker_extension_cls="sqlrl.policy.vllm_worker.WeightSync")``) and mixes it into the worker;
``LLM.collective_rpc("sqlrl_load_weights", args=(path,))`` then runs the method on every worker.
This is vLLM's mechanism for RLHF weight updates (its ``rlhf`` examples), used here without
restarting the engine.

Guarantees:
- ``sqlrl_load_weights(path)`` reads a safetensors file of HF-named tensors (what
  ``VLLMBackend.load_weights`` writes) and hands them to the worker's ``reload_weights`` (vLLM's
  in-place reload: the model's own ``load_weights`` maps HF names onto vLLM's fused layers --
  q/k/v into ``qkv_proj``, gate/up into ``gate_up_proj`` -- shards them under tensor parallelism,
  and re-runs the post-load processing, e.g. the CPU backend's repacked linear weights, which a
  plain ``model.load_weights`` would miss). Returns how many tensors it read. A tensor the model
  does not know, or of the wrong shape, raises from vLLM's loader.
- importing it registers ``FILE_TRANSFER`` (``sqlrl.policy.vllm_transfer.FileWeightTransfer``) with
  vLLM's weight-transfer factory, in every process that imports it: vLLM imports this module in
  its worker before the worker builds its weight-transfer engine, so ``VLLMEngine``'s
  ``weight_transfer_config={"backend": FILE_TRANSFER}`` resolves there (idempotent; a no-op where
  vLLM is not installed).
This module imports nothing heavy at import time (vLLM's factory registers the backend lazily).
"""

from __future__ import annotations

from typing import Any

FILE_TRANSFER = "sqlrl_file"


def register_file_transfer() -> None:
    """Register ``FILE_TRANSFER`` with vLLM's ``WeightTransferEngineFactory`` (idempotent)."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    try:
        WeightTransferEngineFactory.register_engine(FILE_TRANSFER, "sqlrl.policy.vllm_transfer",
                                                    "FileWeightTransfer")
    except ValueError:  # already registered in this process
        pass


register_file_transfer()


class WeightSync:
    """Mixed into vLLM's worker class; ``self.model_runner`` is the worker's model runner."""

    model_runner: Any

    def sqlrl_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        tensors = load_file(path, device=str(self.model_runner.device))
        reload = getattr(self, "reload_weights", None)  # vLLM's in-place reload (0.32 has it)
        if reload is not None:
            reload(weights_iterator=iter(tensors.items()))
        else:  # older vLLM (the GPU lock's 0.24): the model's loader; GPU layers need no repacking
            self.model_runner.model.load_weights(weights=iter(tensors.items()))
        return len(tensors)
