"""sqlrl: the Ray-free core of a system that trains and serves tool-using SQL agents with RL.

This package never imports ray (tests/packaging/test_no_ray.py enforces it); Ray lives in actors/,
jobs/ and serve/.
"""

__version__ = "0.1.0"
