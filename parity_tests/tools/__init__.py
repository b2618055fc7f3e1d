"""Tools that go with the suite but are not tests: ``mutation.py`` (bug injection, run as
``python -m parity_tests.tools.mutation``) and ``sharding_worker.py`` (the 8-device subprocess
that ``test_sharding.py`` starts as a script). pytest collects nothing here.
"""
