"""Modules the tests and the benchmarks share (imported as helpers.<module>: tests/ is on
sys.path, where pytest puts it for tests/conftest.py and benchmarks/_common.py for the
benchmarks), and the rank programs some tests start by path. Cells, specs, synthetic metrics
files and workflow copies are written here once (tests/unit/test_shared_helpers.py)."""
