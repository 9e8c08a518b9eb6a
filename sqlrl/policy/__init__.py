"""Policies: the tool chat template, the tiny test model, SmolLM2, loading, and generation backends.

The contract (``SamplingParams``, ``Generation``, ``GenerationBackend``) is in ``types`` and imports
nothing heavy; the other modules import torch/transformers only when their functions are called,
except ``hf_backend``/``load`` which need them at call time too. ``vllm_backend`` imports vllm lazily.
"""

from .chat import TOOL_CHAT_TEMPLATE
from .types import Generation, GenerationBackend, SamplingParams

__all__ = ["TOOL_CHAT_TEMPLATE", "Generation", "GenerationBackend", "SamplingParams"]
