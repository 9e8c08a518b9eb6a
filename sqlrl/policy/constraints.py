"""Structured output: a grammar a request's tokens must follow (forced tool calls, JSON schemas).

``StructuredOutput`` (frozen, hashable; it rides on ``SamplingParams.structured``) holds ONE grammar
in xgrammar's EBNF dialect -- the grammar vLLM's structured outputs take
(``StructuredOutputsParams(grammar=...)``, compiled by its xgrammar backend), so both engines enforce
the very same language:

- ``VLLMEngine`` passes it to vLLM (its scheduler masks the logits of the request every step);
- ``HFEngine`` masks with ``GrammarMasks`` (this module, on xgrammar: a ``GrammarCompiler`` per
  tokenizer and one ``GrammarMatcher`` per request) before temperature / top-p, so the token is
  drawn from the masked distribution and its log-prob is that distribution's (what the RL loss and
  ``logprobs`` need: the behaviour policy actually sampled from).

When the grammar is complete only the engine's end tokens are allowed (xgrammar's stop tokens are
the policy's ``eos_token_ids`` on both engines), so a constrained turn ends with ``"eos"`` unless
``max_new_tokens`` cuts it (``"length"``).

Builders (they import xgrammar, ~4 s the first time, only when called):
- ``json_grammar(schema, suffix="")``: JSON text valid under ``schema`` (compact separators
  ``", "``/``": "`` as ``json.dumps`` writes them, no free whitespace, ``strict_mode``: objects
  take no properties the schema does not name), then the literal ``suffix``;
- ``literal_grammar(text)``: exactly ``text``.
A schema xgrammar cannot compile is a ``ValueError`` naming the problem, raised by the builder
(serving answers it with a 400), never inside an engine. Which engines honour the field: ``HFEngine``
and ``VLLMEngine``; the lock-step adapter (``BatchedEngine``) and the scripted engine refuse a
request that carries one (``refuse_structured``: ``ValueError``), never ignore it (serving asks
``serve.engines.EngineKind.constrains`` and sends none to them).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class StructuredOutput:
    """A grammar (xgrammar EBNF, root rule ``root``) the generated tokens must match."""

    grammar: str

    def __post_init__(self) -> None:
        if not isinstance(self.grammar, str) or "root" not in self.grammar:
            raise ValueError("StructuredOutput.grammar must be EBNF text with a 'root' rule")


def refuse_structured(sampling: Any, engine: str) -> None:
    """``ValueError`` when ``sampling`` carries a grammar: for the engines that cannot honour one."""
    if getattr(sampling, "structured", None) is not None:
        raise ValueError(f"{engine} cannot constrain generation to a grammar (SamplingParams.structured); "
                         "use the hf or vllm engine (make_engine)")


def _xgr() -> Any:
    import xgrammar

    return xgrammar


def json_grammar(schema: Mapping[str, Any], suffix: str = "") -> StructuredOutput:
    """JSON valid under ``schema``, then exactly ``suffix`` (module docstring)."""
    xgr = _xgr()
    try:
        text = json.dumps(schema)
        grammar = xgr.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=True)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"the JSON schema cannot be compiled into a grammar: {exc}") from None
    if suffix:
        grammar = xgr.Grammar.concat(grammar, xgr.Grammar.from_ebnf(f"root ::= {json.dumps(suffix)}"))
    return StructuredOutput(str(grammar))


def literal_grammar(text: str) -> StructuredOutput:
    return StructuredOutput(str(_xgr().Grammar.from_ebnf(f"root ::= {json.dumps(text)}")))


class GrammarMasks:
    """xgrammar for one tokenizer: compiled grammars (cached by text) and per-request matchers.

    ``vocab_size`` is the width of the model's logits (it may exceed the tokenizer's vocabulary;
    the extra ids are never allowed); ``stop_token_ids`` the ids that may end a complete grammar."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        xgr = _xgr()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=int(vocab_size),
                                                  stop_token_ids=[int(t) for t in stop_token_ids])
        self.vocab_size = int(vocab_size)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True)
        self._lock = threading.Lock()

    def compile(self, structured: StructuredOutput) -> Any:
        """The compiled grammar (``ValueError`` when the EBNF does not parse)."""
        try:
            with self._lock:
                return self._compiler.compile_grammar(structured.grammar)
        except RuntimeError as exc:
            raise ValueError(f"the grammar does not compile: {exc}") from None

    def matcher(self, compiled: Any) -> "Matcher":
        return Matcher(compiled, self.vocab_size)


class Matcher:
    """One request's position in its grammar: ``mask(logits_row)`` sets every token the grammar does
    not allow next to ``-inf`` (in place), ``accept(token)`` advances it (False: not allowed)."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        xgr = _xgr()
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits_row: Any) -> None:
        """``logits_row``: a ``[V]`` or ``[1, V]`` tensor (CPU or CUDA), masked in place."""
        xgr = _xgr()
        self._matcher.fill_next_token_bitmask(self._bitmask)
        row = logits_row if logits_row.dim() == 2 else logits_row.unsqueeze(0)
        xgr.apply_token_bitmask_inplace(row, self._bitmask.to(row.device))

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(int(token_id)))

    @property
    def terminated(self) -> bool:
        return bool(self._matcher.is_terminated())
