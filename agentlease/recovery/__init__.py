"""Recovery: the policy each attempt consults before it runs a tool (:func:`decide`, ``docs/recovery.md``), and
:class:`ExpiredLeaseSweeper`, which ends the leases whose holders died (``agentlease sweep``).
"""

from __future__ import annotations

from agentlease.recovery._policy import RecoveryDecision, classify, decide
from agentlease.recovery._sweeper import ExpiredLeaseSweeper, SweeperSettings

__all__ = ["ExpiredLeaseSweeper", "RecoveryDecision", "SweeperSettings", "classify", "decide"]
