"""The main job's presets: which curricula (variants) to run, and what each stage changes.

    python -m jobs.main                    # the "default" preset: the shipped stage configs as they are
    python -m jobs.main --preset long      # jobs/configs/presets/long.yaml: Zeno and Talon, 144 held-out tasks

A preset file (YAML) holds:

- ``run_dir``: where the run goes (``--run-dir`` wins);
- ``variants``: name -> overrides; each variant is one whole curriculum from the base model in
  ``<run_dir>/<name>`` (e.g. Zeno, the unified mixture, and Talon, debugging only). A preset with
  no variants runs one curriculum in ``run_dir`` itself. Inside a variant, a key that names a
  stage holds overrides for that stage of that variant only
  (``zeno: {data.mixture: …, stage3: {rl.steps: 16}}``);
- ``all``: overrides for every stage of every variant; ``stages``: ``{stage: overrides}``;
- ``spider_eval``: how many Spider dev questions to evaluate every checkpoint on (single-turn, a
  fixed stratified subset; only when the job is given ``--spider-eval PATH``); 0 = none.

Overrides are ``{dotted.key: value}`` mappings, turned into the stage jobs' ``key=value``
arguments (values as YAML, so a mapping such as a mixture replaces the shipped one).

Guarantees: ``load_preset(name)`` returns a frozen ``Preset``; an unknown preset name, a missing
file, a key the file may not have or an override naming an unknown stage is a ``ValueError``
naming it (a variant's stage key is checked against the stages too). The order of arguments is:
the stage's shipped config, then ``all``, then the stage's own overrides, then the variant's, then
the variant's for that stage, then the command line's (the last wins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

HERE = Path(__file__).resolve().parent / "configs" / "presets"
PRESETS: dict[str, Path | None] = {"default": None, "long": HERE / "long.yaml"}
KEYS = {"description", "run_dir", "variants", "all", "stages", "spider_eval"}


@dataclass(frozen=True)
class Preset:
    name: str
    run_dir: str | None = None
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    all: Mapping[str, Any] = field(default_factory=dict)
    stages: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    spider_eval: int = 0
    variant_stages: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)

    def variant_names(self) -> list[str]:
        """The variants in file order; ``[""]`` (one curriculum in the run dir) when there are none."""
        return list(self.variants) or [""]

    def overrides(self, stage: str, variant: str = "") -> list[str]:
        """The ``key=value`` arguments this preset adds for ``stage`` of ``variant``."""
        merged = {**self.all, **self.stages.get(stage, {}), **self.variants.get(variant, {}),
                  **self.variant_stages.get(variant, {}).get(stage, {})}
        return [f"{k}={_yaml(v)}" for k, v in merged.items()]


def _yaml(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def load_preset(name: str, stages: Mapping[str, Any] | None = None) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    path = PRESETS[name]
    if path is None:
        return Preset(name)
    if not path.is_file():
        raise ValueError(f"preset {name!r}: {path} does not exist")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"preset {name!r}: {path} must hold a mapping")
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise ValueError(f"preset {name!r}: unknown key(s) {', '.join(unknown)}; a preset has: {', '.join(sorted(KEYS))}")
    for section in ("variants", "all", "stages"):
        if not isinstance(raw.get(section) or {}, dict):
            raise ValueError(f"preset {name!r}: {section} must be a mapping")
    bad = sorted(set(raw.get("stages") or {}) - set(stages or raw.get("stages") or {}))
    if bad:
        raise ValueError(f"preset {name!r}: unknown stage(s) {', '.join(bad)}; known: {', '.join(stages or {})}")
    known = set(stages or {})
    variants, variant_stages = {}, {}
    for v, ov in (raw.get("variants") or {}).items():
        if not isinstance(v, str) or not v.isidentifier() or not isinstance(ov or {}, dict):
            raise ValueError(f"preset {name!r}: variant {v!r} needs a plain name and a mapping of overrides")
        variants[v] = {k: x for k, x in (ov or {}).items() if not _is_stage(k, known)}
        variant_stages[v] = {k: x for k, x in (ov or {}).items() if _is_stage(k, known)}
        for stage, sov in variant_stages[v].items():
            if not isinstance(sov or {}, dict):
                raise ValueError(f"preset {name!r}: variant {v!r}, {stage}: needs a mapping of overrides")
            if known and stage not in known:
                raise ValueError(f"preset {name!r}: variant {v!r}: unknown stage {stage}; known: {', '.join(stages or {})}")
            variant_stages[v][stage] = dict(sov or {})
    return Preset(name, run_dir=raw.get("run_dir"), variants=variants,
                  all=dict(raw.get("all") or {}), stages={s: dict(o or {}) for s, o in (raw.get("stages") or {}).items()},
                  spider_eval=int(raw.get("spider_eval") or 0), variant_stages=variant_stages)


def _is_stage(key: Any, known: set[str]) -> bool:
    """A variant's key meant as a stage: a registered stage's name or any ``stage<N>`` (an
    unregistered one is then refused by name). A config key has a dot or names a config section."""
    return isinstance(key, str) and (key in known or re.fullmatch(r"stage\d+", key) is not None)
