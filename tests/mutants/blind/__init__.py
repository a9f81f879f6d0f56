"""The blind set: wrong and right implementations written by testers who read only a lesson's exercise text
(lessons/NN_topic.ipynb as a learner gets it), never the checks, the reference solutions or tests/mutants.

One module per lesson, tests/mutants/blind/<topic>.py, each with
    BLIND = {check grade_id: {"wrong": [entry, ...], "right": [entry, ...]}}   (entries as in registry.py)
    WHY = {mutant name: the mistake, in a line}
tests/test_blind_mutants.py runs every entry through its check as the grader does (cases="all").
"""
