"""``ScriptedBackend``: a ``GenerationBackend`` that answers with canned turns (tests, demos, benches).

A script is a list of rules ``{"match": text, "turns": [text, ...]}``: the first rule whose
``match`` occurs in the decoded prompt answers it, with ``turns[k]`` where ``k`` is the number of
assistant turns the prompt already holds (the last turn repeats); ``default`` answers prompts that
no rule matches. Texts are tokenised with the policy's real tokenizer and end with the end-of-turn
token (``finish_reason "eos"``), cut at ``max_new_tokens`` (``"length"``).

``gate_file``: when set, ``generate`` waits until that file exists (polling every 10 ms, at most
``gate_timeout_s``) before answering -- a cross-process event that lets tests hold requests in
flight without sleeping for a guessed time. With ``gate_after_tokens: k`` it waits after
reporting the first k tokens of an answer instead (a generation caught half-way, for streaming).

``generate(..., on_token=)`` reports each answer's tokens in order (``streams_tokens``).

Guarantees: deterministic; log-probs are 0.0 (it is not a model); never loads torch.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Mapping, Sequence

from .types import Generation, SamplingParams

ASSISTANT_TURN = "<|im_start|>assistant"


class ScriptedBackend:
    def __init__(self, tokenizer: Any, eos_token_ids: Sequence[int] = (), *,
                 script: Sequence[Mapping[str, Any]] = (), default: str = "I cannot help with that.",
                 end_of_turn: str = "<|im_end|>", gate_file: str | None = None,
                 gate_timeout_s: float = 120.0, gate_after_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.rules = [(str(r["match"]), [str(t) for t in r["turns"]]) for r in script]
        if any(not turns for _, turns in self.rules):
            raise ValueError("every script rule needs at least one turn")
        self.default = default
        self.end_ids = tokenizer.encode(end_of_turn, add_special_tokens=False)
        self.gate_file, self.gate_timeout_s = gate_file, gate_timeout_s
        self.gate_after_tokens = gate_after_tokens
        self.calls: list[int] = []  # prompts per generate call

    def _wait_gate(self) -> None:
        if not self.gate_file:
            return
        deadline = time.monotonic() + self.gate_timeout_s
        while not os.path.exists(self.gate_file) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _text(self, prompt: str) -> str:
        k = max(0, prompt.count(ASSISTANT_TURN) - 1)
        for match, turns in self.rules:
            if match in prompt:
                return turns[min(k, len(turns) - 1)]
        return self.default

    streams_tokens = True

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 on_token: Callable[[int, int], None] | None = None) -> list[Generation]:
        if not self.gate_after_tokens:
            self._wait_gate()
        self.calls.append(len(prompts))
        out = []
        for p in prompts:
            text = self._text(self.tokenizer.decode(list(p), skip_special_tokens=False))
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + list(self.end_ids)
            reason = "eos"
            if len(ids) > params.max_new_tokens:
                ids, reason = ids[:params.max_new_tokens], "length"
            decoded = self.tokenizer.decode(ids, skip_special_tokens=True)  # as HFBackend
            for _ in range(params.n):
                for k, tok in enumerate(ids):
                    if self.gate_after_tokens and k == self.gate_after_tokens:
                        self._wait_gate()
                    if on_token is not None:
                        on_token(len(out), tok)
                out.append(Generation(tuple(ids), (0.0,) * len(ids), decoded, reason))
        return out
