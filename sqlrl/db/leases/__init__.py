"""The DB-session pool's lease protocol, Ray-free (docs/pool.md).

- ``protocol``: the typed values sent between callers and shards (``Lease``, ``Catalog``, ...).
- ``shard``: ``ShardCore``, one shard: a ``SessionPool`` plus a lease table with a TTL.
- ``partition``: ``PartitionPlan``, which shards serve which caller and dialect.
- ``client``: ``PoolClient``, the caller's side (routing, retries, batches) over a ``Transport``.

``actors/db_pool.py`` puts each shard in a Ray actor; ``sqlrl.db.source.PoolSessions`` opens
sessions through a client.
"""
