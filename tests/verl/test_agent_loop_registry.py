"""verl's agent-loop registry keeps the entry the shipped agent-loop YAML gives ``sqlrl_agent``.

A verl ``AgentLoopWorker`` loads ``jobs/configs/verl/agent_loop.yaml`` into its registry, and the
first trajectory's ``hydra.utils.instantiate`` is what imports ``actors.verl.agent_loop``. Were the
module to register itself on import (verl's ``@register``), that import would replace the entry
with a bare ``_target_``: every later trajectory of the worker would get no ``pool``/``catalog``.
A fresh interpreter is the only place where that import is the first one, so the check runs in one.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed (it is in the CPU lock)")

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

(entry,) = OmegaConf.load(sys.argv[1])  # what AgentLoopWorker.__init__ does with the YAML
_agent_loop_registry[entry.name] = entry
assert "actors.verl.agent_loop" not in sys.modules
import actors.verl.agent_loop  # what the first trajectory's instantiate does
kept = _agent_loop_registry[entry.name]
assert kept is entry, dict(kept)
print(sorted(kept))
"""


@pytest.mark.slow
def test_importing_the_agent_loop_keeps_the_yaml_entry_and_its_arguments():
    out = subprocess.run([sys.executable, "-c", CHECK, str(ROOT / "jobs/configs/verl/agent_loop.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n")[-2] == "['_target_', 'catalog', 'deadline_s', 'name', 'pool']"
