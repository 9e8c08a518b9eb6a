"""Build the embedded default data: ``python -m sqlrl.synth --out data/synth``.

Writes the seeded domain databases (Spider layout), text-to-SQL tasks and verified debugging
tasks per split (see ``dataset.build_default_dataset``). ``--spider PATH`` also writes verified
debugging tasks made from a Spider split's gold SQL (``spider_critic_<split>.jsonl``), read from
the path you give (the data is never copied).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .dataset import build_default_dataset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sqlrl.synth", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-per-domain", type=int, default=300)
    ap.add_argument("--domains", help="comma-separated (default: all)")
    ap.add_argument("--no-critic", action="store_true", help="text-to-SQL tasks only")
    ap.add_argument("--spider", help="a Spider folder: also build debugging tasks from its gold SQL")
    ap.add_argument("--spider-split", default="dev")
    a = ap.parse_args(argv)
    try:
        manifest = build_default_dataset(a.out, a.seed, a.n_per_domain,
                                         a.domains.split(",") if a.domains else None,
                                         critic=not a.no_critic)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"splits": manifest.splits, "seconds": round(manifest.seconds, 1)}, indent=1))
    if a.spider:
        from ..tasks.io import write_tasks
        from .critic_gen import spider_critic_tasks

        tasks, report = spider_critic_tasks(a.spider, split=a.spider_split, seed=a.seed)
        path = Path(a.out) / f"spider_critic_{a.spider_split}.jsonl"
        write_tasks(path, tasks)
        print(f"{path}: {len(tasks)} debugging tasks; {report.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
