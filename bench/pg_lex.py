"""PostgreSQL statement reading: ``postgresql_lex.lex`` against the whole-text scan it replaced.

    python bench/pg_lex.py [--data ../shared/data] [--rounds 15] [--out /tmp/pg_lex.json]

``lex`` reads a text that parses from a prefix and libpg_query's comment list; ``_lex_full`` is
the whole-text scan it replaced (and still the path for text that does not parse); both give the
same ``Statement`` (tests/unit/test_pg_lex_fast.py). Per query set (Spider dev, BIRD mini-dev, and
BIRD with a trailing ``;`` or a trailing comment), ``--rounds`` rounds; each round times both
over the whole set, in alternating order, uncached. Reports the medians and the median of the
per-round ratios lex / whole scan. Prints a table and writes JSON. Needs the Spider and BIRD
mini-dev files (``--data``); not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlrl.db.dialects import postgresql_lex as lx  # noqa: E402


def query_sets(data: Path) -> dict[str, list[str]]:
    spider = json.loads((data / "spider" / "dev.json").read_text())
    bird = json.loads((data / "bird_minidev" / "mini_dev_postgresql.json").read_text())
    sp = list(dict.fromkeys(item["query"].strip() for item in spider))
    bd = list(dict.fromkeys(item["SQL"].strip() for item in bird))
    return {"spider": sp, "bird": bd, "bird + ';'": [q + ";" for q in bd],
            "bird + comment": [q + "\n-- note" for q in bd]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out", default="/tmp/pg_lex.json")
    args = ap.parse_args()
    try:
        sets = query_sets(Path(args.data))
    except FileNotFoundError as exc:
        sys.exit(f"query files not found ({exc.filename}): pass --data <folder with spider/ and "
                 "bird_minidev/>")
    variants = (("lex", lx.lex.__wrapped__), ("whole scan", lx._lex_full))
    rows = []
    for name, texts in sets.items():
        us: dict[str, list[float]] = {"lex": [], "whole scan": []}
        ratios = []
        for rnd in range(args.rounds):
            got = {}
            for label, fn in (variants if rnd % 2 else variants[::-1]):
                t0 = time.perf_counter()
                for text in texts:
                    fn(text)
                got[label] = (time.perf_counter() - t0) / len(texts) * 1e6
            for label, value in got.items():
                us[label].append(value)
            ratios.append(got["lex"] / got["whole scan"])
        rows.append({"set": name, "queries": len(texts), "lex_us": statistics.median(us["lex"]),
                     "whole_scan_us": statistics.median(us["whole scan"]),
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios)})
    load = os.getloadavg()
    print(f"µs per text (medians of {args.rounds} rounds); ratio: median of per-round lex / whole "
          f"scan; load {load}")
    print(f"{'set':16s} {'queries':>7s} {'lex':>7s} {'whole':>7s} {'ratio':>7s} {'range':>13s}")
    for r in rows:
        print(f"{r['set']:16s} {r['queries']:7d} {r['lex_us']:7.1f} {r['whole_scan_us']:7.1f} "
              f"{r['ratio']:7.3f} {r['ratio_min']:6.3f}-{r['ratio_max']:.3f}")
    Path(args.out).write_text(json.dumps({"rows": rows, "load": load}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
