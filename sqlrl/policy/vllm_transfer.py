"""``FileWeightTransfer``: a vLLM weight-transfer backend (``weight_transfer_config={"backend":
"sqlrl_file"}``) that carries the learner's weights in a safetensors file in shared memory, so that
vLLM's own RL API (``init_weight_transfer_engine``, ``start_weight_update`` / ``update_weights`` /
``finish_weight_update``, weight versions) runs on vLLM's CPU build too.

Why a backend of our own: vLLM 0.32's built-in backends (``nccl``, ``ipc``, ``sparse_nccl``, ...)
move tensors between GPUs (NCCL broadcasts, CUDA IPC handles), and the base class's
``update_weights`` ends with ``torch.accelerator.synchronize()``, which raises ``RuntimeError:
Cannot access accelerator device when none is available`` on a CPU-only machine. Everything else
of the RL API works on the CPU build: this class is only the transport.

Guarantees:
- ``start_weight_update`` / ``finish_weight_update`` run vLLM's layerwise reload around the load, as
  its NCCL backend does (HF names mapped onto fused layers by the model's ``load_weights``, the
  post-load processing re-run, e.g. the CPU backend's repacked linear weights);
- ``update_weights({"path": ...})`` reads the HF-named tensors of ``path``
  (``sqlrl.policy.vllm_backend.write_weights_file``) onto the worker's device and loads them; a
  name the model does not know, or a wrong shape, raises from vLLM's loader (``VLLMEngine`` refuses
  such weights before they get here);
- no device synchronisation on CPU (none is needed: the load is synchronous); on a GPU it synchronises.
vLLM imports this module lazily in its worker processes (``sqlrl.policy.vllm_worker`` registers it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    """No rendezvous: the file's path travels with each update."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    path: str


class FileWeightTransfer(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        return None

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        from safetensors.torch import load_file

        tensors = load_file(update_info.path, device=str(self.device))
        self.model.load_weights(iter(tensors.items()))

    def shutdown(self) -> None:
        return None
