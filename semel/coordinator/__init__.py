"""Coordinators: groups and committed offsets, transactions, producer ids.

Every operation follows one rule: validate, append the new state to the
coordinator's log, and only after the append succeeded apply it to memory with
the same function that replays the log at start.
"""
