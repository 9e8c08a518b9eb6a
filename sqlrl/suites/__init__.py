"""Test-suite execution match: near-miss neighbours of a gold query (``neighbours``) and the suites of
database variants distilled to tell the gold from them (``test_suite``). A layer above ``synth``
(it builds the variants with the data generator) and below ``rewards`` (the judge checks on them)."""
