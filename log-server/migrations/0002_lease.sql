-- The sequencer's lease (docs/storage.md, "PostgreSQL layout"; docs/
-- operations.md, "Running on PostgreSQL"): one row. A process may write the
-- log only while it holds an unexpired lease whose token is its own; every
-- write transaction checks that (FOR SHARE, so a takeover waits for it).
-- A takeover of an expired lease increments the token (the fencing token).
CREATE TABLE log_lease (
    id         smallint    PRIMARY KEY CHECK (id = 1),
    token      bigint      NOT NULL,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
INSERT INTO log_lease (id, token, holder, expires_at) VALUES (1, 0, '', '-infinity');
