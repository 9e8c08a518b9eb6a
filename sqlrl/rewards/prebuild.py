"""Test suites built before training, and variant bases dropped after it (``reward.test_suite``).

    report = prebuild_suites(judge, tasks)        # judge = Judge(catalog, suites=TestSuites(dir))
    dropped = drop_variant_bases(catalog, dir)     # at the end of a stage: no variant base stays

Without a prebuild a gold's suite is distilled inside the first reward call that needs it (the
gold and up to 48 neighbours on the original and on every variant), so the first batch of a new
task can hit the reward group's ``batch_timeout_s``. ``prebuild_suites`` distils the suite of every
text-to-SQL task once, before the first step: the variants are built and the suites written under
the Judge's ``TestSuites`` folder (the run dir), where every reward actor reads them back instead
of distilling. A suite already in the folder is read, not distilled again.

Guarantees:
- Only tasks of the text-to-SQL kind have suites (``kind_of(task) is TEXT2SQL``); others are
  counted in ``skipped``. Distinct golds (same database, dialect and gold) are distilled once.
- Never raises for one task: a gold that fails on the original (such a task is excluded from
  training anyway) or a server task without a SQLite copy is listed in ``failed`` with its reason,
  and the other tasks go on. A Judge without suites is a ``ValueError`` (a configuration error).
- ``drop_variant_bases`` drops every variant base the folder loaded on the servers of
  ``catalog`` (``sqlrl.synth.variants.drop_server_variants``) and returns their names; suites
  stay in the folder and load the bases they name again when read back (``TestSuites``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from sqlrl.suites.test_suite import TestSuites
from sqlrl.synth.variants import drop_server_variants, sqlite_path
from sqlrl.tasks.kinds import TEXT2SQL, kind_of

__all__ = ["PrebuildReport", "drop_variant_bases", "prebuild_suites"]


@dataclass(frozen=True)
class PrebuildReport:
    tasks: int  # text-to-SQL tasks given
    golds: int  # distinct (database, dialect, gold) among them
    distilled: int  # suites distilled by this call (the others were read from the folder)
    variants: int  # variants kept over all suites
    skipped: int  # tasks of other kinds (no suite)
    failed: tuple[tuple[str, str], ...] = ()  # (task id, why) for golds without a suite

    def summary(self) -> str:
        return (f"{self.golds} test suites for {self.tasks} text-to-SQL tasks ({self.distilled} "
                f"distilled, {self.golds - self.distilled - len(self.failed)} read back, "
                f"{self.variants} variants kept, {len(self.failed)} failed)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prebuild_suites(judge: Any, tasks: Sequence[Any]) -> PrebuildReport:
    """Distil (or read back) the suite of every text-to-SQL task's gold (module doc)."""
    suites: TestSuites | None = judge.suites
    if suites is None:
        raise ValueError("prebuild_suites needs a Judge with test suites (Judge(..., suites=TestSuites(dir)))")
    before = suites.distilled
    seen: set[tuple[str, str, str]] = set()
    failed: list[tuple[str, str]] = []
    n = variants = 0
    for task in tasks:
        if kind_of(task) is not TEXT2SQL:
            continue
        n += 1
        key = (task.db_id, task.dialect, task.gold_sql)
        if key in seen:
            continue
        seen.add(key)
        try:
            variants += len(judge.suite(task).variants)
        except (ValueError, OSError) as exc:  # GoldFailed is a ValueError
            failed.append((task.task_id, f"{type(exc).__name__}: {exc}"))
    return PrebuildReport(n, len(seen), suites.distilled - before, variants, len(tasks) - n, tuple(failed))


def drop_variant_bases(catalog: Mapping[str, Mapping[str, str]], suite_dir: str | Path) -> list[str]:
    """Drop every variant base ``suite_dir`` loaded on the servers ``catalog`` names."""
    dropped: list[str] = []
    servers = sorted({url for urls in catalog.values() for url in urls.values() if sqlite_path(url) is None})
    for url in servers:
        dropped += drop_server_variants(url, Path(suite_dir) / "servers")
    return dropped
