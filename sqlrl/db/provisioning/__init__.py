"""Server provisioning: the databases sessions run on (docs/sessions.md, docs/loader.md).

- ``provision``: bases on a server (``prepare_server``, ``create_database``, ``seal_database``,
  ``session_url``, ``drop_database``), through the admin class each engine's descriptor names.
- ``loader``: task databases (a SQLite file) loaded into every dialect.
- ``scratch``: per-session scratch databases and roles cloned from a base, prepared ahead.
- ``admin``: one server seen with one admin account (``AdminServer``), as ``scratch`` uses it.
"""
