"""Execution-match evaluation: the official Spider (test-suite) and BIRD comparators and evaluators.

``compare`` holds the pure row comparators; ``spider`` and ``bird`` run the official input formats
through ``sqlrl.db`` sessions. ``critic`` (BIRD-CRITIC test cases) is separate.
"""

from .bird import BirdReport, BirdVerdict, evaluate_bird, label_bird
from .compare import bird_ex, spider_clean_pred, spider_ex, spider_order_matters, spider_prepare
from .spider import QueryRunner, SpiderPair, SpiderReport, SpiderVerdict, evaluate_spider, label_pairs

__all__ = ["BirdReport", "BirdVerdict", "QueryRunner", "SpiderPair", "SpiderReport", "SpiderVerdict",
           "bird_ex", "evaluate_bird", "label_bird", "label_pairs", "evaluate_spider",
           "spider_clean_pred", "spider_ex", "spider_order_matters", "spider_prepare"]
