-- Cosignatures of checkpoints (docs/storage.md, "The `LogStore` contract"
-- rule 7, and "PostgreSQL layout"): one line per (tree size, cosigner key
-- `name+hex8(keyid)`), added beside the stored checkpoint note and never
-- replaced.
CREATE TABLE log_cosignatures (
    size     bigint NOT NULL REFERENCES log_checkpoints (size),
    cosigner text   NOT NULL,
    line     text   NOT NULL,
    PRIMARY KEY (size, cosigner)
);
