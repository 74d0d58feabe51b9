"""The read-only web view of the ledger: runs, tasks and lease timelines."""
