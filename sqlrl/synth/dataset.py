"""The default synthetic text-to-SQL dataset: every domain's database plus verified tasks, split.

    manifest = build_default_dataset("data/synth", seed=0)

Layout written under ``out_dir`` (Spider's database layout, so ``load_jsonl(path, db_root=...)``
and the Spider-style evaluators work on it):

    databases/<db_id>/<db_id>.sqlite
    text2sql_train.jsonl  text2sql_dev.jsonl  text2sql_test.jsonl       split by task
    text2sql_heldout_train.jsonl  text2sql_heldout_test.jsonl            split by database
    critic_<split>.jsonl (for each split above, unless critic=False)      debugging tasks
    manifest.json

Guarantees:
- The task split is stratified by (domain, difficulty) and deterministic per seed; every task is in
  exactly one of train/dev/test. The database split puts every task of ``held_out`` domains in
  ``heldout_test`` and all others in ``heldout_train`` (no database appears in both).
- The same arguments give byte-identical files; ``manifest.json`` records the seed, the counts per
  domain and difficulty, the split sizes and the SHA-256 of every file written (it holds no
  timings, so it is reproducible too).
- Debugging tasks (``critic_*.jsonl``, BIRD-CRITIC format) are made by bug injection from the
  text-to-SQL tasks *of the same split* (``critic_gen.make_critic_tasks``, every instance verified
  by execution), so no debugging instance leaks a gold query across splits.
- Bad arguments (unknown domain, held-out domain not built, non-positive ``n_per_domain``, split
  fractions that are negative or do not sum to 1) raise ``ValueError`` before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..tasks.io import write_tasks
from ..tasks.types import DIFFICULTIES, Task, Text2SQLTask
from .domains import DOMAINS, build_domain_db, get_domain
from .text2sql import generate_text2sql

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class DatasetManifest:
    out_dir: str
    seed: int
    n_per_domain: int
    scale: float
    domains: tuple[str, ...]
    held_out: tuple[str, ...]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # domain -> difficulty -> tasks
    splits: dict[str, int] = field(default_factory=dict)  # file -> tasks
    files: dict[str, str] = field(default_factory=dict)  # path relative to out_dir -> sha256
    seconds: float = field(default=0.0, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "n_per_domain": self.n_per_domain, "scale": self.scale,
                "domains": list(self.domains), "held_out": list(self.held_out), "counts": self.counts,
                "splits": self.splits, "files": self.files}


def db_file(out_dir: str | Path, db_id: str) -> Path:
    return Path(out_dir) / "databases" / db_id / f"{db_id}.sqlite"


def split_by_task(tasks: Sequence[Text2SQLTask], seed: int,
                  fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> dict[str, list[Text2SQLTask]]:
    """Stratified by (db_id, difficulty), deterministic; keeps the input order within a split."""
    _check_fractions(fractions)
    groups: dict[tuple[str, str | None], list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault((t.db_id, t.difficulty), []).append(i)
    where: dict[int, str] = {}
    for (db_id, level), idx in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        idx = list(idx)
        random.Random(f"split:{seed}:{db_id}:{level}").shuffle(idx)
        n_train = round(len(idx) * fractions[0])
        n_dev = round(len(idx) * (fractions[0] + fractions[1])) - n_train
        for j, i in enumerate(idx):
            where[i] = "train" if j < n_train else ("dev" if j < n_train + n_dev else "test")
    out: dict[str, list[Text2SQLTask]] = {s: [] for s in SPLITS}
    for i, t in enumerate(tasks):
        out[where[i]].append(t)
    return out


def split_by_database(tasks: Sequence[Text2SQLTask], held_out: Sequence[str]) -> dict[str, list[Text2SQLTask]]:
    """``train``: tasks on databases not in ``held_out``; ``test``: tasks on those databases."""
    held = set(held_out)
    return {"train": [t for t in tasks if t.db_id not in held], "test": [t for t in tasks if t.db_id in held]}


def _check_fractions(fractions: Sequence[float]) -> None:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"split fractions must be three non-negative numbers summing to 1, got {fractions!r}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_default_dataset(out_dir: str | Path, seed: int = 0, n_per_domain: int = 300,
                          domains: Sequence[str] | None = None, *, scale: float = 1.0,
                          held_out: Sequence[str] | None = None,
                          fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                          difficulties: Sequence[str] = DIFFICULTIES,
                          critic: bool = True, critic_per_task: int = 1) -> DatasetManifest:
    """Build every domain's database and ``n_per_domain`` tasks on it under ``out_dir``.

    ``held_out`` (default: one domain other than "shop", chosen by ``seed``; none when only one
    domain is built) names the databases of the by-database test split."""
    t0 = time.perf_counter()
    names = list(domains) if domains is not None else list(DOMAINS)
    if not names:
        raise ValueError("domains must name at least one domain")
    if len(set(names)) != len(names):
        raise ValueError(f"domains lists a domain twice: {names}")
    for name in names:
        get_domain(name)
    if not isinstance(n_per_domain, int) or n_per_domain < 1:
        raise ValueError(f"n_per_domain must be a positive integer, got {n_per_domain!r}")
    _check_fractions(fractions)
    if held_out is None:
        pool = sorted(n for n in names if n != "shop") or sorted(names)
        held = (random.Random(f"heldout:{seed}").choice(pool),) if len(names) > 1 else ()
    else:
        held = tuple(held_out)
        missing = [h for h in held if h not in names]
        if missing:
            raise ValueError(f"held-out domains {missing} are not among the domains built ({names})")
    out = Path(out_dir)
    tasks: list[Text2SQLTask] = []
    counts: dict[str, dict[str, int]] = {}
    files: list[Path] = []
    for name in names:
        path = db_file(out, name)
        build_domain_db(name, str(path), seed, scale)
        files.append(path)
        found = generate_text2sql(name, str(path), n_per_domain, seed, difficulties)
        counts[name] = {lvl: sum(t.difficulty == lvl for t in found) for lvl in difficulties}
        tasks.extend(found)
    written: dict[str, list[Task]] = {
        f"text2sql_{s}.jsonl": part for s, part in split_by_task(tasks, seed, fractions).items()}
    if held:
        written.update({f"text2sql_heldout_{s}.jsonl": part
                        for s, part in split_by_database(tasks, held).items()})
    if critic:
        from .critic_gen import make_critic_tasks

        catalog = {name: {"sqlite": f"sqlite:///{db_file(out, name).resolve()}"} for name in names}
        for fname, part in list(written.items()):
            made, _ = make_critic_tasks(part, catalog, seed=seed, per_task=critic_per_task)
            written[fname.replace("text2sql_", "critic_")] = made
    for fname, part in written.items():
        write_tasks(out / fname, part)
        files.append(out / fname)
    manifest = DatasetManifest(
        out_dir=str(out), seed=seed, n_per_domain=n_per_domain, scale=scale, domains=tuple(names),
        held_out=held, counts=counts, splits={f: len(p) for f, p in written.items()},
        files={os.path.relpath(p, out): _sha256(p) for p in files})
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, out / "manifest.json")
    return DatasetManifest(**{**manifest.__dict__, "seconds": time.perf_counter() - t0})
