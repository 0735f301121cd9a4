-- Symbol store, SQLite flavour. Keep in step with ../postgres/0001_symbol_store.sql.

-- Content-addressed blobs in the object store. A row exists only once the
-- object is complete; rows without references are marked and later collected.
CREATE TABLE blobs (
    sha256      TEXT PRIMARY KEY NOT NULL,
    size        BIGINT NOT NULL,
    -- JSON section table [[name, offset, size], ...] for ELF blobs, NULL otherwise.
    sections    TEXT,
    created_at  BIGINT NOT NULL,   -- unix milliseconds
    orphaned_at BIGINT             -- set by the collector while unreferenced
);
CREATE INDEX blobs_orphaned ON blobs (orphaned_at) WHERE orphaned_at IS NOT NULL;

-- Every accepted candidate per (build-ID, kind); the best one is served.
CREATE TABLE artifacts (
    build_id     TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('executable', 'debuginfo')),
    sha256       TEXT NOT NULL REFERENCES blobs (sha256),
    size         BIGINT NOT NULL,
    quality      INTEGER NOT NULL,
    has_dwarf    BOOLEAN NOT NULL,
    has_symtab   BOOLEAN NOT NULL,
    has_dynsym   BOOLEAN NOT NULL,
    architecture TEXT NOT NULL,
    file_name    TEXT NOT NULL,
    origin       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (build_id, kind, sha256)
);
CREATE INDEX artifacts_sha256 ON artifacts (sha256);
CREATE INDEX artifacts_file_name ON artifacts (file_name);

-- Source paths the DWARF of a build-ID names (canonical, absolute).
CREATE TABLE source_names (
    build_id TEXT NOT NULL,
    path     TEXT NOT NULL,
    PRIMARY KEY (build_id, path)
);

-- Uploaded source files; the latest upload of a path wins.
CREATE TABLE sources (
    build_id   TEXT NOT NULL,
    path       TEXT NOT NULL,
    sha256     TEXT NOT NULL REFERENCES blobs (sha256),
    size       BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (build_id, path)
);
CREATE INDEX sources_sha256 ON sources (sha256);
