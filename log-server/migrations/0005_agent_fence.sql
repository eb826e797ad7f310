-- The key-change fence on PostgreSQL (docs/protocol.md §4.1 "Key changes";
-- docs/storage.md, "PostgreSQL layout"; docs/operations.md, "Running on
-- PostgreSQL"). One row per agent that has committed records or had a key
-- change:
-- - latest_time: the largest `time` (Unix milliseconds) of the agent's
--   committed records, kept by the sequencer's commit transaction (the
--   same transaction that inserts the entries); NULL without records;
-- - key_version: incremented by every rotation or retirement of the agent,
--   in the transaction that writes its new validity ranges.
-- Every admission notes the key_version its key check saw. The commit
-- transaction upserts the rows of its batch's agents (which locks them)
-- and refuses the whole batch, writing nothing, when a record was admitted
-- under an older version; the sequencer then answers those records
-- "keys changed" and the admitting front checks them again. A key change
-- locks the agent's row first (FOR UPDATE), reads latest_time from it, and
-- only then checks its instant. So a record and a key change of its agent
-- are serialised by this row, whichever fronts they went through.
CREATE TABLE log_agent_fence (
    agent       text   PRIMARY KEY,
    key_version bigint NOT NULL DEFAULT 0,
    latest_time bigint
);

-- The agents already in the log, with the latest time of their records
-- (the record's `time`, RFC 3339 with milliseconds, as Unix milliseconds).
INSERT INTO log_agent_fence (agent, latest_time)
SELECT agent,
       max(round(extract(epoch FROM
           ((convert_from(canonical, 'UTF8')::jsonb #>> '{record,time}')::timestamptz)) * 1000)::bigint)
FROM log_entries
GROUP BY agent;
