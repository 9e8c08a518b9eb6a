"""The session engine: opening a trajectory-scoped session on a URL and running SQL on it.

- ``session``: ``open_session`` / ``Session`` (one connection, one trajectory; docs/sessions.md).
- ``executor``: the one SQL executor every dialect runs through (timeouts, row/byte caps, sandbox).
- ``normalize``: rows to JSON-safe values; ``watchdog``: the killing timer of a running statement.
- ``pool``: ``SessionPool``, checkout/checkin of sessions in one process (a shard's pool).

Builds on ``sqlrl.db.dialects`` (the engine adapters), ``sqlrl.db.statements``, ``sqlrl.db.types``
and ``sqlrl.db.url``; server engines take their per-session databases from
``sqlrl.db.provisioning.scratch`` (``session`` imports it, so its ``SCRATCH`` is registered as
the server-clone adapters' clone source before any session opens).
"""
