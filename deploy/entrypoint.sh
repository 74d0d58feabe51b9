#!/bin/sh
# Entrypoint of the agentlease worker image: `agentlease <command> [args]`, `worker` by default.
# The process replaces this shell (exec), so SIGTERM from the container runtime reaches it: a
# worker stops polling, lets running tools finish within AGENTLEASE_SHUTDOWN_GRACE, then releases
# the leases it still holds. tests/acceptance/test_deploy.py runs this same script outside Docker.
set -eu
if [ "$#" -eq 0 ]; then
    set -- worker
fi
exec agentlease "$@"
