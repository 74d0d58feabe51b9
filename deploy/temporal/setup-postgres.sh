#!/bin/sh
# One-shot schema setup of Temporal's two PostgreSQL databases (run by temporalio/admin-tools).
# Safe to run again: `create` tolerates an existing database, the schema steps apply only what is new.
set -eu
for db in temporal temporal_visibility; do
    schema=$([ "$db" = temporal ] && echo temporal || echo visibility)
    temporal-sql-tool --plugin postgres12 --ep temporal-db -p 5432 -u temporal --db "$db" create || true
    temporal-sql-tool --plugin postgres12 --ep temporal-db -p 5432 -u temporal --db "$db" setup-schema -v 0.0 || true
    temporal-sql-tool --plugin postgres12 --ep temporal-db -p 5432 -u temporal --db "$db" \
        update-schema -d "/etc/temporal/schema/postgresql/v12/$schema/versioned"
done
