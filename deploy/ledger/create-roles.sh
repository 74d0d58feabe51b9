#!/bin/sh
# First start of the ledger database (PostgreSQL's /docker-entrypoint-initdb.d): the three login
# roles of a least-privilege ledger. Their privileges come later, from `agentlease db grant --apply`
# once the schema exists (the `ledger-grants` service); docs/security-operations.md, "Database roles".
#
#   LEDGER_WORKER_ROLE   (agentlease_worker)    the workers: lease operations only
#   LEDGER_OPERATOR_ROLE (agentlease_operator)  operators: reads and decisions
#   LEDGER_READER_ROLE   (agentlease_reader)    dashboards and incident review: reads only
#
# with passwords LEDGER_WORKER_PASSWORD, LEDGER_OPERATOR_PASSWORD, LEDGER_READER_PASSWORD. A role
# that already exists is left as it is, so the script can run again. Values reach SQL as psql
# variables (:'name'), quoted by the server's own format().
set -eu
psql -v ON_ERROR_STOP=1 -X -q \
    --username "${POSTGRES_USER:?}" --dbname "${POSTGRES_DB:-$POSTGRES_USER}" \
    -v worker="${LEDGER_WORKER_ROLE:-agentlease_worker}" \
    -v worker_password="${LEDGER_WORKER_PASSWORD:?set LEDGER_WORKER_PASSWORD}" \
    -v operator="${LEDGER_OPERATOR_ROLE:-agentlease_operator}" \
    -v operator_password="${LEDGER_OPERATOR_PASSWORD:?set LEDGER_OPERATOR_PASSWORD}" \
    -v reader="${LEDGER_READER_ROLE:-agentlease_reader}" \
    -v reader_password="${LEDGER_READER_PASSWORD:?set LEDGER_READER_PASSWORD}" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', :'worker', :'worker_password')
    WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'worker') \gexec
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', :'operator', :'operator_password')
    WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'operator') \gexec
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', :'reader', :'reader_password')
    WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'reader') \gexec
SQL
