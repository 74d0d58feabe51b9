"""This deployment's reconciliation: the sweeper's entry point (``python -m reconciliation``) and its runbook
(``reconciliation/RUNBOOK.md``)."""
