"""``examples.run_clients --timeout-s``: the agent's per-call client timeout reaches ``run_agent``
(both example agents take ``timeout_s``), 300 s when not given; a timeout <= 0 is refused on the
command line before any client process starts."""

from __future__ import annotations

import inspect

import pytest

import examples.run_clients as rc
from examples.langgraph_sql_agent.agent import SQLAgent
from examples.openai_client_agent.agent import run_agent as openai_run_agent


def _options(monkeypatch, argv):
    seen = {}

    def fake(gateway, key, agent, k, options, connect_timeout_s, kinds):
        seen.update(options)
        return [0] * k

    monkeypatch.setattr(rc, "run_clients", fake)
    assert rc.main(["--gateway", "http://127.0.0.1:9", "--api-key", "k", *argv]) == 0
    return seen


def test_the_timeout_reaches_the_agents_options(monkeypatch):
    assert _options(monkeypatch, [])["timeout_s"] == 300.0
    assert _options(monkeypatch, ["--timeout-s", "1800"])["timeout_s"] == 1800.0
    for takes in (inspect.signature(SQLAgent).parameters, inspect.signature(openai_run_agent).parameters):
        assert "timeout_s" in takes  # what the option is handed to


@pytest.mark.parametrize("bad", ["0", "-5"])
def test_a_timeout_not_above_zero_is_refused(monkeypatch, capsys, bad):
    monkeypatch.setattr(rc, "run_clients", lambda *a: pytest.fail("no client may start"))
    with pytest.raises(SystemExit) as exc:
        rc.main(["--gateway", "http://127.0.0.1:9", "--api-key", "k", "--timeout-s", bad])
    assert exc.value.code == 2 and "--timeout-s must be > 0" in capsys.readouterr().err
