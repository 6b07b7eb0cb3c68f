"""Unit tests: one folder per subpackage of scripts/dlscale, and benchmarks/, envs/, cross/.

Packages, so that a test module imports as unit.<folder>.test_x (tests/ is on sys.path: see
tests/conftest.py) and two folders may hold test modules of one basename."""
