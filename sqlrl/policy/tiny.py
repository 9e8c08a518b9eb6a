"""A tiny random-init Qwen2 policy with a locally trained tokenizer, for tests and CPU smoke runs.

``build_tiny_model(out_dir, seed=0, ...)`` writes a normal HF checkpoint folder (``config.json``,
``model.safetensors``, ``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json``) that
``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` load with ``local_files_only=True``.

Guarantees:
- No network: the tokenizer is a byte-level BPE trained here with ``tokenizers`` on ``corpus``
  (default: the shipped ``tiny_corpus.jsonl.gz`` next to this module -- questions, gold SQL and
  CREATE TABLE text of three synthetic domains, plus tool-using chat turns whose tool responses are
  in ``sqlrl.tools``' one observation format; ``python -m sqlrl.synth.corpus`` writes it, so
  this layer never imports the data generator). Byte-level, so any text round-trips.
- Vocabulary: ``<|endoftext|>`` (pad, id 0), ``<|im_start|>`` (1), ``<|im_end|>`` (2, EOS) are special
  tokens; ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` are added tokens
  (single ids, not special: ``decode(skip_special_tokens=True)`` keeps them), ids right after the BPE
  vocabulary. The model's vocabulary is ``len(tokenizer)``. The tokenizer carries
  ``sqlrl.policy.chat.TOOL_CHAT_TEMPLATE`` and adds no BOS.
- Weights are drawn with ``init_std`` (default 0.2, not Qwen's 0.02): at 0.02 a random model
  greedily repeats one token whatever the prompt, at 0.2 its outputs depend on the prompt, which
  is what the padding/batching tests need.
- The same ``(seed, sizes, corpus, init_std)`` gives byte-identical tokenizer files and identical weights
  (weights are drawn under ``torch.random.fork_rng``: the caller's RNG state is untouched).
- The folder is written atomically (temp folder + rename); an existing non-empty ``out_dir`` is an
  error (``FileExistsError``), bad sizes raise ``ValueError``.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from .chat import ENDOFTEXT, IM_END, SPECIAL_TOKENS, TOOL_CHAT_TEMPLATE, TOOL_TAGS

CORPUS_FILE = Path(__file__).with_name("tiny_corpus.jsonl.gz")
# Qwen2's pre-tokenizer split (NFC + this regex + byte-level): ``AutoTokenizer`` loads a checkpoint whose
# config says ``qwen2`` as ``Qwen2Tokenizer``, which rebuilds exactly this pipeline around the saved vocab.
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


@functools.lru_cache(maxsize=1)
def default_corpus() -> tuple[str, ...]:
    """The shipped training text (``CORPUS_FILE``: gzip'd JSON lines, one text each), in order."""
    with gzip.open(CORPUS_FILE, "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f)


def _train_tokenizer(corpus: Iterable[str], vocab_size: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(list(corpus), trainer=trainer)
    raw.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=IM_END, pad_token=ENDOFTEXT,
                                  unk_token=None, bos_token=None, model_max_length=32768,
                                  padding_side="left")
    tok.chat_template = TOOL_CHAT_TEMPLATE
    return tok


def build_tiny_model(out_dir: str | os.PathLike, *, seed: int = 0, hidden_size: int = 64, layers: int = 2,
                     heads: int = 4, vocab_size: int = 2048, corpus: Sequence[str] | None = None,
                     init_std: float = 0.2) -> Path:
    """Train the tokenizer, build a random-init ``Qwen2ForCausalLM``, save both into ``out_dir``; return it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size < 8 or layers < 1 or heads < 1 or hidden_size % heads or (hidden_size // heads) % 2:
        raise ValueError(f"bad sizes: hidden_size={hidden_size} must be divisible by heads={heads} into an even "
                         f"head dimension, layers={layers} >= 1")
    if not init_std > 0:
        raise ValueError(f"init_std={init_std} must be > 0")
    if vocab_size < 300:
        raise ValueError(f"vocab_size={vocab_size} must be >= 300 (256 byte symbols + special tokens + merges)")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} already exists and is not an empty folder")
    corpus = default_corpus() if corpus is None else tuple(corpus)
    if not corpus:
        raise ValueError("corpus is empty")

    tok = _train_tokenizer(corpus, vocab_size)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    kv_heads = heads // 2 if heads % 2 == 0 else heads
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 3,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=10000.0,
                         bos_token_id=None, eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT],
                         initializer_range=init_std, use_cache=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=ids[IM_END], pad_token_id=ids[ENDOFTEXT])

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
