-- The console's sessions on PostgreSQL, schema version 2 (docs/storage.md,
-- "The registry and the console on PostgreSQL"; docs/console.md "Access"),
-- shared by every front on the database. Applied as 0001 is. A row holds no
-- secret: not the session token (only its SHA-256, the session's id) and
-- not the API key (only its public id and its SHA-256, as api_keys holds
-- them), so that a front re-checks the key on every request.
CREATE TABLE console_sessions (
    id          text   PRIMARY KEY,   -- SHA-256 of the session token, hex
    project     text   NOT NULL,
    key_id      text   NOT NULL,      -- the API key's public id
    key_sha256  text   NOT NULL,      -- SHA-256 of the API key, hex
    created_ms  bigint NOT NULL,      -- Unix milliseconds, the front's clock
    expires_ms  bigint NOT NULL,
    -- Login order, for "the oldest session" (clock ties are common).
    login_order bigint GENERATED ALWAYS AS IDENTITY
);
-- The login's census (sessions per project and key, oldest first) and
-- the deletion of expired sessions.
CREATE INDEX console_sessions_by_key ON console_sessions (project, key_id, login_order);
CREATE INDEX console_sessions_by_expiry ON console_sessions (expires_ms);
