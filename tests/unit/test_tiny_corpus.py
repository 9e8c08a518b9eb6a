"""The tiny model's shipped tokenizer corpus: what ``sqlrl.synth.corpus`` writes, with tool
responses in the one observation format."""

from __future__ import annotations

import re

from sqlrl.policy.chat import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN
from sqlrl.policy.tiny import CORPUS_FILE, default_corpus
from sqlrl.synth import corpus

FOOTER = re.compile(r"^\((\d+ rows?|first \d+ of \d+ rows shown|first \d+ rows shown; .*)\)$|^OK\b|^Error \(")


def test_the_shipped_corpus_is_what_the_generator_writes():
    assert corpus.CORPUS_PATH == CORPUS_FILE
    assert corpus.check(), "run: python -m sqlrl.synth.corpus (then commit the file)"


def test_check_fails_on_a_changed_file(tmp_path):
    changed = tmp_path / "c.jsonl.gz"
    changed.write_bytes(corpus.encode(default_corpus()[:-1]))
    assert not corpus.check(changed)
    assert not corpus.check(tmp_path / "missing.jsonl.gz")


def test_tool_responses_are_observations_not_json():
    responses = [t.split(TOOL_RESPONSE_OPEN + "\n", 1)[1].split("\n" + TOOL_RESPONSE_CLOSE, 1)[0]
                 for t in default_corpus() if TOOL_RESPONSE_OPEN in t]
    assert len(responses) == len(corpus.CORPUS_DOMAINS) * corpus.TASKS_PER_DOMAIN
    for text in responses:
        assert not text.lstrip().startswith("{"), text
        assert FOOTER.match(text.splitlines()[-1]), text
    assert any(" | " in r.splitlines()[0] for r in responses)  # multi-column headers occur


def test_encoding_is_deterministic_and_round_trips():
    texts = ("a\nb", "é ✓", "")
    assert corpus.encode(texts) == corpus.encode(texts)
    import gzip
    import json

    assert [json.loads(line) for line in gzip.decompress(corpus.encode(texts)).decode().splitlines()] \
        == list(texts)
