"""Chat formats: messages -> token ids, such that a multi-turn trajectory is an exact concatenation.

The agent loop never re-tokenises what the model generated. A trajectory's ids are built as

    prompt_ids(messages) + gen_1 + continuation_ids(...) + gen_2 + continuation_ids(...) + gen_3 ...

where ``gen_k`` are the sampled ids, exactly as the backend returned them.

**End of turn.** A generated turn normally ends with the template's end-of-turn token (Qwen:
``<|im_end|>``) because generation stops there (EOS or stop string, included in the ids). What
the template puts *after* that token (Qwen: ``"\\n"``), then the tool results, then the next
generation prompt, is the continuation. So ``continuation_ids`` renders the conversation twice --
``A`` = the messages ending with the assistant turn, ``B`` = ``A``'s messages + the tool results
with the generation prompt -- checks that ``A`` is a prefix of ``B`` (prefix stability) and returns
``A[after its last end-of-turn token:] + B[len(A):]``. How the template re-renders the assistant
turn itself (e.g. re-serialised tool-call JSON) never enters the ids: only what follows its
end-of-turn token does. When a turn did *not* end with the end-of-turn ids (stopped by another stop
string such as ``</tool_call>``, or cut by ``max_new_tokens``), ``close_turn=True`` puts them at
the front of the continuation, so the model then reads a well-formed conversation.

Guarantees:
- ``HFChatFormat`` renders with ``tokenizer.apply_chat_template(..., tokenize=True)``; a template
  that is not prefix-stable, or whose assistant turn has no end-of-turn token, raises
  ``ChatFormatError`` naming the first differing token -- never silently misaligned ids.
- The end-of-turn token is found by rendering a probe conversation (the first special token after
  the assistant's text) unless given; ``ChatFormatError`` when it cannot be determined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Sequence


class ChatFormatError(ValueError):
    """The chat template cannot give exact, concatenable token ids."""


class ChatFormat(Protocol):
    end_of_turn: str  # the text that ends an assistant turn (stripped before parsing)
    turn_end_ids: tuple[int, ...]  # its token ids

    def prompt_ids(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        """The conversation rendered with the generation prompt."""

    def continuation_ids(self, messages: Sequence[dict], new_messages: Sequence[dict],
                         tools: list[dict] | None = None, *, close_turn: bool = False) -> list[int]:
        """The ids that follow the last assistant turn's generated ids when ``new_messages`` are
        appended, up to and including the next generation prompt."""

    def decode(self, ids: Sequence[int]) -> str: ...


class HFChatFormat:
    """A ``ChatFormat`` over a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn if end_of_turn is not None else self._probe_end_of_turn()
        ids = tokenizer.encode(self.end_of_turn, add_special_tokens=False)
        if not ids:
            raise ChatFormatError(f"the end-of-turn text {self.end_of_turn!r} encodes to no tokens")
        self.turn_end_ids = tuple(int(i) for i in ids)

    # -- the protocol ----------------------------------------------------------------------------

    def prompt_ids(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        return self._render(messages, tools, True)

    def continuation_ids(self, messages: Sequence[dict], new_messages: Sequence[dict],
                         tools: list[dict] | None = None, *, close_turn: bool = False) -> list[int]:
        if not messages or messages[-1].get("role") != "assistant":
            raise ChatFormatError("continuation_ids needs a conversation that ends with an "
                                  "assistant message")
        before = self._render(messages, tools, False)
        after = self._render(list(messages) + list(new_messages), tools, True)
        if after[:len(before)] != before:
            raise ChatFormatError(self._mismatch(before, after))
        start = len(self._render(messages[:-1], tools, True))
        end = _end_of_last(before, self.turn_end_ids)
        if end is None or end <= start:
            raise ChatFormatError(f"the chat template renders the assistant turn without the "
                                  f"end-of-turn token {self.end_of_turn!r}; pass end_of_turn= "
                                  "the token this template ends assistant turns with")
        tail = before[end:] + after[len(before):]
        return list(self.turn_end_ids) + tail if close_turn else tail

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # -- helpers ---------------------------------------------------------------------------------

    def _render(self, messages: Sequence[dict], tools: list[dict] | None, gen: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(list(messages), tools=tools,
                                                 add_generation_prompt=gen, tokenize=True)
        if isinstance(out, Mapping):  # BatchEncoding (return_dict defaults differ by version)
            out = out["input_ids"]
        return [int(i) for i in out]

    def _probe_end_of_turn(self) -> str:
        user = [{"role": "user", "content": "Hi"}]
        head = self._render(user, None, True)
        full = self._render(user + [{"role": "assistant", "content": "Hello"}], None, False)
        special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
        if full[:len(head)] == head:
            for i in full[len(head):]:
                if i in special:
                    return self.tokenizer.decode([i], skip_special_tokens=False)
        eos = getattr(self.tokenizer, "eos_token", None)
        if eos:
            return eos
        raise ChatFormatError("cannot tell which token ends an assistant turn in this chat "
                              "template; pass end_of_turn=")

    def _mismatch(self, before: list[int], after: list[int]) -> str:
        i = next((k for k, (x, y) in enumerate(zip(before, after)) if x != y), len(after))
        lo = max(0, i - 20)
        return ("the chat template is not prefix-stable: appending messages changes the rendering "
                f"of the earlier conversation at token {i} "
                f"({self.decode(before[lo:i + 20])!r} became {self.decode(after[lo:i + 20])!r}), "
                "so token ids cannot be concatenated exactly; use a template whose earlier turns "
                "do not change when messages are appended")


def _end_of_last(ids: list[int], pattern: tuple[int, ...]) -> int | None:
    """The index just after the last occurrence of ``pattern`` in ``ids``."""
    n = len(pattern)
    for k in range(len(ids) - n, -1, -1):
        if tuple(ids[k:k + n]) == pattern:
            return k + n
    return None
