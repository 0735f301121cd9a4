-- Idempotency of exports: the content hash of the segment each export was
-- stored as, kept after compaction has merged that segment away, so that a
-- sender's retry of an acknowledged export is recognised at any time within
-- the key's lifetime (see server/src/profiles/compact.rs). Keep the
-- sqlite/ and postgres/ copies in step.
CREATE TABLE profile_exports (
    tenant     TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    created_at BIGINT NOT NULL,   -- unix milliseconds
    PRIMARY KEY (tenant, sha256)
);
CREATE INDEX profile_exports_created ON profile_exports (created_at);

-- A segment the compactor could not read (why, in words): it is left out of
-- compaction and reported, instead of stopping every later pass.
ALTER TABLE profile_segments ADD COLUMN quarantined TEXT;
