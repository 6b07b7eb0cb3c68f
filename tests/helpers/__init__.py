"""Modules the tests share (imported as helpers.<module>: tests/ is on sys.path, see
tests/conftest.py) and the rank programs some tests start by path."""
