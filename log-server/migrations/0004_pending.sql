-- Records admitted by a front that does not sequence, waiting for the
-- sequencer (docs/storage.md, "PostgreSQL layout"; docs/operations.md,
-- "Running on PostgreSQL", "Several fronts"). One row per request (a
-- batch keeps its order inside its row), inserted by the admitting front
-- with NOTIFY tally_pending; the lease holder feeds open rows to its group
-- commit in id order and writes each row's answers (entry index or refusal
-- code per item) with NOTIFY tally_answers. The waiting front reads its
-- answers, builds the receipts from the log's tables, and deletes the row;
-- the sequencer deletes answered rows nobody came back for after an hour.
CREATE TABLE tally_pending (
    id          bigserial   PRIMARY KEY,
    front       text        NOT NULL,
    received    bigint      NOT NULL,
    items       text        NOT NULL,
    answers     text,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    answered_at timestamptz
);
CREATE INDEX tally_pending_open ON tally_pending (id) WHERE answers IS NULL;
