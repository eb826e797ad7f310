-- The registry and the console's auditor links on PostgreSQL, schema
-- version 1 (docs/storage.md, "The registry and the console on
-- PostgreSQL"). Applied once, in a transaction, by tally_witness::kv's
-- PostgreSQL backend; the version is then recorded in
-- registry_schema_version. Never edit a migration that has shipped: add the
-- next file instead.

-- Every row of the registry (tables projects, api_keys, agents, meta,
-- read_tokens) and of the console (auditor_links): the same key -> value
-- rows as in witness.redb and console.redb; `value` is the same bytes (JSON
-- for every row but meta's admin_token_sha256, which is 32 raw bytes).
CREATE TABLE registry_rows (
    tbl   text  NOT NULL,
    key   text  NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (tbl, key)
);

-- One counter per store ('registry', 'console'), incremented in the same
-- transaction as every write to its rows: a front that sees it change
-- reloads its in-memory copy (docs/operations.md, "Running on PostgreSQL").
CREATE TABLE registry_generation (
    scope text   PRIMARY KEY,
    gen   bigint NOT NULL
);
INSERT INTO registry_generation (scope, gen) VALUES ('registry', 0), ('console', 0);
