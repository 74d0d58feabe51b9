#!/bin/sh
# One-shot: the namespace the workers use, and agentlease's search attributes on it.
set -eu
ns="${DEFAULT_NAMESPACE:-default}"
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" | grep -qw SERVING; do sleep 2; done
temporal operator namespace describe --address "$TEMPORAL_ADDRESS" "$ns" >/dev/null 2>&1 \
    || temporal operator namespace create --address "$TEMPORAL_ADDRESS" --retention 7d "$ns"
# NAME:TYPE of each attribute (agentlease/search_attributes.py; tests/acceptance/test_deploy.py checks the list).
for attribute in AgentLeaseStatus:Keyword AgentLeaseWaitingReason:Keyword AgentLeaseTool:Keyword \
    AgentLeaseStage:Keyword AgentLeaseGeneration:Int AgentLeaseOwner:Keyword AgentLeaseDecision:Keyword \
    AgentLeaseRefusedWrites:Int; do
    temporal operator search-attribute create --address "$TEMPORAL_ADDRESS" --namespace "$ns" \
        --name "${attribute%%:*}" --type "${attribute##*:}" 2>/dev/null || true
done
