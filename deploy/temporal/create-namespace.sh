#!/bin/sh
# One-shot: the namespace the workers use, and agentlease's search attributes on it.
set -eu
ns="${DEFAULT_NAMESPACE:-default}"
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" | grep -qw SERVING; do sleep 2; done
temporal operator namespace describe --address "$TEMPORAL_ADDRESS" "$ns" >/dev/null 2>&1 \
    || temporal operator namespace create --address "$TEMPORAL_ADDRESS" --retention 7d "$ns"
for name in AgentLeaseStatus AgentLeaseWaitingReason AgentLeaseTool AgentLeaseStage; do
    temporal operator search-attribute create --address "$TEMPORAL_ADDRESS" --namespace "$ns" \
        --name "$name" --type Keyword 2>/dev/null || true
done
