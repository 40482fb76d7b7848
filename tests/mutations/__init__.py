"""Mutation runs: plant a known defect in a copy of the checkout and see the tests catch it.

``python -m tests.mutations`` (see ``docs/testing.md``, "Mutation runs") plants each defect of
:data:`tests.mutations.defects.DEFECTS`, one at a time, in a fresh temporary copy of the
working tree, runs the tests there (the whole suite, or the defect's own catchers) and reports
in JSON whether they failed. The pure parts (planting a replacement, parsing pytest's summary,
classifying exit statuses) are in :mod:`tests.mutations.core` and unit-tested in
``tests/unit/test_mutations.py``; the runs themselves are not part of the suite or CI.
"""
