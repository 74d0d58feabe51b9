"""Recovery: the stage-aware retry and recovery tables, and the sweeper that ends lapsed leases.

The policy (:func:`decide`, :func:`classify`) is what each attempt consults before it runs a tool
(``docs/recovery.md``); :class:`ExpiredLeaseSweeper` releases the leases whose holders died, in keyset
batches of conditional updates (``agentlease sweep``).
"""

from __future__ import annotations

from agentlease.recovery._policy import RecoveryDecision, classify, decide
from agentlease.recovery._sweeper import ExpiredLeaseSweeper, SweeperSettings

__all__ = ["ExpiredLeaseSweeper", "RecoveryDecision", "SweeperSettings", "classify", "decide"]
