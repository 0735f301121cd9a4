-- Symbol indexes (symtrace-symbolize's format), derived from stored files
-- and kept as blobs. Keep the sqlite/ and postgres/ copies in step.
CREATE TABLE symbol_indexes (
    -- "v<format>:<primary sha>:<executable sha or ->:<supplementary sha or ->"
    source_key     TEXT PRIMARY KEY NOT NULL,
    -- The file it was built from; the row goes when that file's last
    -- artifact does (see the collector).
    primary_sha256 TEXT NOT NULL,
    sha256         TEXT NOT NULL REFERENCES blobs (sha256),
    size           BIGINT NOT NULL,
    created_at     BIGINT NOT NULL
);
CREATE INDEX symbol_indexes_sha256 ON symbol_indexes (sha256);
CREATE INDEX symbol_indexes_primary ON symbol_indexes (primary_sha256);
