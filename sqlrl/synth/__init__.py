"""The synthetic task engine: seeded databases in several domains and tasks generated over them.

``DOMAINS`` / ``build_domain_db`` (``domains``), ``generate_text2sql`` (``text2sql``),
``build_default_dataset`` (``dataset``) and ``translate_tasks`` (``translate``, multi-dialect
variants verified on real servers). Each module states its own guarantees.
"""

from .dataset import DatasetManifest, build_default_dataset, split_by_database, split_by_task
from .domains import DOMAINS, Domain, build_domain_db, get_domain
from .text2sql import TEMPLATES, generate_text2sql

__all__ = ["DOMAINS", "DatasetManifest", "Domain", "TEMPLATES", "build_default_dataset",
           "build_domain_db", "generate_text2sql", "get_domain", "split_by_database", "split_by_task"]
