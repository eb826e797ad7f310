-- The log on PostgreSQL, schema version 1 (docs/storage.md, "PostgreSQL
-- layout"). Applied once, in a transaction, by PostgresStore::open; the
-- version is then recorded in tally_schema_version. Never edit a migration
-- that has shipped: add the next file instead.

-- Named counters: 'tree_size' is the number of committed entries; its row
-- is locked by every write, which serialises the writers.
CREATE TABLE log_meta (
    key   text   PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO log_meta (key, value) VALUES ('tree_size', 0), ('syncs', 0);

-- One row per entry, with the keys it is looked up by. The unique indexes
-- are a second guard behind the sequencer's rules: a nonce, a record or an
-- (agent, seq) can never be committed twice, whichever front writes.
CREATE TABLE log_entries (
    idx          bigint PRIMARY KEY CHECK (idx >= 0),
    canonical    bytea  NOT NULL,
    leaf_hash    bytea  NOT NULL CHECK (length(leaf_hash) = 32),
    record_hash  bytea  NOT NULL CHECK (length(record_hash) = 32),
    nonce        bytea  NOT NULL,
    agent        text   NOT NULL,
    seq          bigint NOT NULL CHECK (seq >= 0),
    receipt_size bigint NOT NULL CHECK (receipt_size > idx)
);
CREATE UNIQUE INDEX log_entries_record ON log_entries (record_hash);
CREATE UNIQUE INDEX log_entries_nonce ON log_entries (nonce);
CREATE UNIQUE INDEX log_entries_chain ON log_entries (agent, seq);
CREATE INDEX log_entries_leaf ON log_entries (leaf_hash);

-- The stored hashes of the tree in the Go sumdb/tlog layout
-- (tlog_tiles::stored_hash_index): a dense array, appended, never rewritten.
CREATE TABLE log_hashes (
    id   bigint PRIMARY KEY CHECK (id >= 0),
    hash bytea  NOT NULL CHECK (length(hash) = 32)
);

-- Signed checkpoint notes by tree size; one note per size, never replaced.
CREATE TABLE log_checkpoints (
    size bigint PRIMARY KEY CHECK (size >= 0),
    note text   NOT NULL
);
