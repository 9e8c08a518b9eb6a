"""Natural-language phrasings for the text-to-SQL templates.

``question(intent, slots, rng)`` picks one of several patterns for the intent, fills the slots and
varies the opening verb ("List", "Show me", "Give", ...), so the same query shape is asked in many
ways. ``condition(op, column, value, rng)`` phrases one filter as a relative clause that can follow
a noun ("books *whose genre is fantasy*").

Guarantees: output depends only on the arguments and the ``random.Random`` state (deterministic per
seed); every intent has at least three patterns; an unknown intent or operator raises ``KeyError``
naming it; a missing slot raises ``KeyError`` naming the slot and the pattern.
"""

from __future__ import annotations

import random
import re
from typing import Any

OPENERS = ("List", "Show", "Show me", "Give", "Find", "Return", "Display", "Get", "Tell me", "Retrieve")

# Relative clauses for one filter; {c} = column phrase, {v}/{w} = values.
CONDITIONS: dict[str, tuple[str, ...]] = {
    "eq": ("whose {c} is {v}", "with {c} {v}", "where the {c} is {v}", "that have {v} as their {c}"),
    "gt": ("whose {c} is greater than {v}", "with a {c} above {v}", "where the {c} exceeds {v}",
           "with {c} more than {v}"),
    "lt": ("whose {c} is less than {v}", "with a {c} below {v}", "where the {c} is under {v}",
           "with {c} lower than {v}"),
    "ge": ("whose {c} is at least {v}", "with a {c} of {v} or more", "where the {c} is {v} or higher"),
    "le": ("whose {c} is at most {v}", "with a {c} of {v} or less", "where the {c} does not exceed {v}"),
    "between": ("whose {c} is between {v} and {w}", "with a {c} from {v} to {w}",
                "where the {c} lies between {v} and {w} (inclusive)"),
    "before": ("whose {c} is before {v}", "with a {c} earlier than {v}", "where the {c} comes before {v}"),
    "after": ("whose {c} is after {v}", "with a {c} later than {v}", "where the {c} falls after {v}"),
    "like": ("whose {c} contains {v}", "with {v} in their {c}", "where the {c} includes the text {v}"),
    "null": ("with no {c} recorded", "whose {c} is missing", "that have no {c}"),
    "notnull": ("that have a {c} recorded", "whose {c} is known", "with a {c} on file"),
}

# Question patterns; {V} is replaced by an opener, {v} by its lower-case form.
QUESTIONS: dict[str, tuple[str, ...]] = {
    "filter_list": (
        "{V} the {label} of every {thing} {cond}.",
        "What are the {labels} of the {things} {cond}?",
        "Which {things} are there {cond}? {V} their {label}.",
        "For all {things} {cond}, {v} the {label}.",
        "I need the {labels} of {things} {cond}.",
    ),
    "count_filter": (
        "How many {things} are there {cond}?",
        "Count the {things} {cond}.",
        "What is the number of {things} {cond}?",
        "{V} how many {things} exist {cond}.",
    ),
    "extreme": (
        "What is the {ext} {measure} among {things}{scope}?",
        "{V} the {ext} {measure} of any {thing}{scope}.",
        "Among {things}{scope}, what is the {ext} {measure}?",
        "Find the {ext} {measure} for {things}{scope}.",
    ),
    "top_k": (
        "{V} the {k} {things} with the {ext} {measure}, with their {label} and {measure}.",
        "Which {k} {things} have the {ext} {measure}? Give the {label} and the {measure}.",
        "What are the top {k} {things} by {measure} ({dir} first)? Show {label} and {measure}.",
        "{V} the {label} and {measure} of the {k} {things} whose {measure} is {ext}.",
    ),
    "join_filter": (
        "{V} the {label} of each {thing} together with its {role}'s {plabel}, for {things} {cond}.",
        "Which {things} are there {cond}? Give their {label} and their {role}'s {plabel}.",
        "For every {thing} {cond}, {v} its {label} and the {plabel} of its {role}.",
        "What are the {labels} of {things} {cond}, and the {plabel} of their {role}?",
    ),
    "group_count": (
        "How many {things} are there for each {col}?",
        "{V} the number of {things} per {col}.",
        "For every {col}, count the {things}.",
        "Break down the {things} by {col}: how many are in each?",
    ),
    "group_agg": (
        "What is the {agg} {measure} of {things} for each {col}?",
        "{V} the {agg} {measure} per {col} across all {things}.",
        "For each {col}, what is the {agg} {measure} of the {things}?",
        "Group the {things} by {col} and {v} the {agg} {measure} of each group.",
    ),
    "group_having": (
        "Which {col} values have more than {k} {things}? Give each with its count.",
        "{V} every {col} shared by more than {k} {things}, with the number of {things}.",
        "For which {col}s are there over {k} {things}? Include the counts.",
    ),
    "join_having": (
        "Which {parents} have at least {k} {things}? {V} the {plabel} and the number of {things}.",
        "{V} the {plabel} of every {parent} with {k} or more {things}, along with how many.",
        "For {parents} that appear as {role} in at least {k} {things}, give the {plabel} and the count.",
    ),
    "join_group_agg": (
        "What is the {agg} {measure} of {things} for each {role} {pcol}?",
        "{V} the {agg} {measure} of {things} grouped by their {role}'s {pcol}.",
        "For every {pcol} of the {role}, what is the {agg} {measure} over the {things}?",
    ),
    "distinct": (
        "What distinct {col} values occur among {things} {cond}?",
        "{V} the different {col}s of {things} {cond}, without duplicates.",
        "Which {col}s appear for {things} {cond}? List each once.",
    ),
    "count_distinct": (
        "How many different {parents} appear as {role} of {things} {cond}?",
        "Count the distinct {parents} that are the {role} of some {thing} {cond}.",
        "For {things} {cond}, how many unique {parents} are involved as {role}?",
    ),
    "in_subquery": (
        "{V} the {plabel} of the {parents} that are the {role} of at least one {thing} {cond}.",
        "Which {parents} are the {role} of some {thing} {cond}? Give their {plabel}.",
        "What are the {plabels} of {parents} linked as {role} to {things} {cond}?",
    ),
    "not_in_subquery": (
        "{V} the {plabel} of every {parent} that is not the {role} of any {thing} {cond}.",
        "Which {parents} are never the {role} of a {thing} {cond}? Give their {plabel}.",
        "What are the {plabels} of {parents} without any {thing} {cond}?",
    ),
    "above_avg": (
        "Among {things} {cond}, which have a {measure} above the average of that group? {V} {label} and {measure}.",
        "{V} the {label} and {measure} of the {things} {cond} whose {measure} is higher than their average.",
        "Which {things} {cond} have a {measure} greater than the mean {measure} of those {things}?",
    ),
    "set_op": (
        "{V} the {pk} and {label} of the {things} {setphrase}.",
        "Which {things} {setphrase}? Give their {pk} and {label}.",
        "Find every {thing} {setphrase}; show the {pk} and the {label}.",
    ),
    "top_per_group": (
        "For each {col}, which {thing} has the {ext} {measure}? Include ties.",
        "{V} the {thing} with the {ext} {measure} in every {col}, with the {col}, {label} and {measure}.",
        "In each {col}, find the {things} ranked first by {measure} ({dir} first).",
    ),
    "rank_list": (
        "Rank the {things} {cond} by {measure} ({dir} first); {v} the {label}, {measure} and rank, with ties sharing a rank.",
        "{V} each {thing} {cond} with its {label}, its {measure} and its {rankname} by {measure}, {dir} first.",
        "Among {things} {cond}, what is the {rankname} of each one by {measure} ({dir} first)? Show {label} and {measure} too.",
    ),
    "cte_max_group": (
        "Which {parent} has the most {things}? {V} its {plabel} and the number of {things}.",
        "{V} the {parent} (or {parents}, if tied) appearing as {role} in the largest number of {things}, with that number.",
        "Find the {plabel} of the {parent} with the highest count of {things}, and the count.",
    ),
    "cte_above_avg": (
        "Which {parents} have more {things} than the average {parent}? {V} the {plabel} and the count.",
        "{V} the {plabel} and number of {things} for every {parent} whose number of {things} is above the average per {parent}.",
        "Find {parents} that are the {role} of more {things} than average; give the {plabel} and how many.",
    ),
}


def _fill(pattern: str, slots: dict[str, Any], rng: random.Random) -> str:
    opener = rng.choice(OPENERS)
    values = dict(slots, V=opener, v=opener[0].lower() + opener[1:])
    try:
        text = pattern.format(**values)
    except KeyError as exc:
        raise KeyError(f"slot {exc.args[0]!r} missing for pattern {pattern!r}") from None
    text = re.sub(r"\s+", " ", text).strip()
    return text[0].upper() + text[1:]


def question(intent: str, slots: dict[str, Any], rng: random.Random) -> str:
    """One phrasing of ``intent`` with ``slots`` filled in."""
    if intent not in QUESTIONS:
        raise KeyError(f"no phrasings for intent {intent!r}; known: {', '.join(sorted(QUESTIONS))}")
    return _fill(rng.choice(QUESTIONS[intent]), slots, rng)


def condition(op: str, column: str, value: str = "", rng: random.Random | None = None,
              value2: str = "") -> str:
    """A relative clause for one filter: ``condition("gt", "price", "20 dollars", rng)``."""
    if op not in CONDITIONS:
        raise KeyError(f"no phrasings for condition {op!r}; known: {', '.join(sorted(CONDITIONS))}")
    patterns = CONDITIONS[op]
    pattern = patterns[0] if rng is None else rng.choice(patterns)
    return pattern.format(c=column, v=value, w=value2)


def plural(phrase: str) -> str:
    """Plural of a short noun phrase ("title" -> "titles", "ISBN" -> "ISBNs", "city" -> "cities")."""
    if phrase.endswith("y") and not phrase.endswith(("ay", "ey", "oy", "uy")):
        return phrase[:-1] + "ies"
    if phrase.endswith(("s", "x", "ch", "sh")):
        return phrase + "es"
    return phrase + "s"
