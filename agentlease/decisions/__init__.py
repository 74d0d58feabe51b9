"""Operators' decisions: the decision table and requests (:mod:`.table`) and the activity that applies a
decision to the ledger (:mod:`._activity`) (``docs/decisions.md``)."""
