"""``/v1/completions``: OpenAI's (legacy) text completions on the same engine (Ray-free, model-free).

- ``CompletionRequest`` (pydantic): ``model``, ``prompt`` (a string, or a list holding one),
  ``max_tokens`` (default 16, as OpenAI's), ``temperature``, ``top_p``, ``n``, ``stop``, ``seed``,
  ``stream`` (a strict boolean; + ``stream_options.include_usage``), ``logprobs`` (null, or 0: the
  sampled token's log-probability per token; above 0 is refused -- the engines return no
  alternatives). Refused with 400 naming them: ``echo``, ``suffix``, ``best_of`` other than
  ``n``, a non-empty ``logit_bias``, several prompts in one request.
- ``text_plan(model, req)``: the raw prompt's tokens (no chat template, no end-of-turn stop) as a
  ``serve.engine.ChatPlan`` through ``ModelEngine.plan`` (so ``n``, the context window and the
  per-choice seeds follow the chat rules).
- ``text_result(model, plan, gens)``: the ``text_completion`` object; ``text_chunk(chat_chunk)``:
  a streamed ``chat.completion.chunk`` of that plan as a ``text_completion`` chunk (None for the
  role chunk), so both endpoints stream through one path.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from .openai_chat import APIError
from .streaming import finish_reason, visible


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: StrictBool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    logit_bias: dict[str, Any] | None = None

    def text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise APIError(400, f"prompt: one prompt per request (got {len(self.prompt)})", param="prompt")
        return self.prompt[0]

    def refuse_unsupported(self) -> None:
        for name, bad, why in (("echo", self.echo, "not supported"),
                               ("suffix", self.suffix, "not supported"),
                               ("best_of", self.best_of not in (None, self.n), "only best_of == n"),
                               ("logit_bias", bool(self.logit_bias), "not supported"),
                               ("logprobs", bool(self.logprobs), "only 0 (the sampled token's "
                                "log-probability); the engines return no alternatives")):
            if bad:
                raise APIError(400, f"{name}: {why}", param=name, code="unsupported_parameter")


def text_plan(model: Any, req: CompletionRequest) -> Any:
    req.refuse_unsupported()
    prompt = req.text()
    if not prompt:
        raise APIError(400, "prompt: must not be empty", param="prompt")
    ids = list(model.policy.tokenizer.encode(prompt, add_special_tokens=False))
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop: at most 4 non-empty strings", param="stop")
    return model.plan(ids, n=req.n, max_tokens=req.max_tokens, temperature=req.temperature,
                      top_p=req.top_p, stop=stop, seed=req.seed, logprobs=req.logprobs is not None)


def legacy_logprobs(content: Sequence[dict[str, Any]] | None, offset: int = 0) -> dict[str, Any] | None:
    """The chat ``logprobs.content`` entries in the legacy completions shape."""
    if content is None:
        return None
    offsets, pos = [], offset
    for t in content:
        offsets.append(pos)
        pos += len(t["token"])
    return {"tokens": [t["token"] for t in content], "token_logprobs": [t["logprob"] for t in content],
            "top_logprobs": None, "text_offset": offsets}


def text_result(model: Any, plan: Any, gens: Sequence[Any]) -> dict[str, Any]:
    choices = []
    for i, g in enumerate(gens):
        text, stopped = visible(g.text, plan.stops)
        lp = model.logprobs_of(plan, g.token_ids, g.logprobs)
        choices.append({"index": i, "text": text, "logprobs": legacy_logprobs(lp and lp["content"]),
                        "finish_reason": finish_reason(g.finish_reason, stopped, False)})
    done = sum(len(g.token_ids) for g in gens)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model.name, "system_fingerprint": None, "choices": choices,
            "usage": {"prompt_tokens": len(plan.ids), "completion_tokens": done,
                      "total_tokens": len(plan.ids) + done}}


def text_chunk(chat_chunk: dict[str, Any]) -> dict[str, Any] | None:
    out = {**chat_chunk, "id": "cmpl-" + chat_chunk["id"].removeprefix("chatcmpl-"), "object": "text_completion"}
    choices = []
    for c in chat_chunk["choices"]:
        delta = c["delta"]
        if delta.get("role") is not None:
            continue  # the chat role chunk has no counterpart here
        lp = c.get("logprobs")
        choices.append({"index": c["index"], "text": delta.get("content", ""),
                        "logprobs": legacy_logprobs(lp and lp["content"]), "finish_reason": c["finish_reason"]})
    if not choices and "usage" not in chat_chunk:
        return None
    out["choices"] = choices
    return out
