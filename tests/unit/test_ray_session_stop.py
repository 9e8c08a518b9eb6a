"""When the suite shuts the actor tests' Ray instance down between tests (tests/conftest.py
``ray_can_stop``): never inside a module, whose module-scoped fixtures may hold actors on it --
in a random order, a test without Ray between two tests of one FSDP group used to kill its ranks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import ray_can_stop

FSDP = Path("tests/actors/test_learner_fsdp.py")


def item(path: Path, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(path=path, fixturenames=list(fixtures))


def test_ray_stays_up_while_the_module_goes_on_even_for_a_test_without_ray() -> None:
    uses_group = item(FSDP, "fsdp", "ray_session")
    assert not ray_can_stop(uses_group, item(FSDP, "tmp_path"))
    assert not ray_can_stop(item(FSDP, "tmp_path"), uses_group)
    assert not ray_can_stop(uses_group, item(FSDP, "fsdp", "ray_session"))


def test_ray_stops_after_the_last_module_in_a_row_that_uses_it() -> None:
    last = item(FSDP, "tmp_path")  # the module's last test need not use Ray itself
    assert ray_can_stop(last, item(Path("tests/unit/test_layers.py")))
    assert ray_can_stop(last, None)
    assert not ray_can_stop(last, item(Path("tests/actors/test_group.py"), "ray_session"))
