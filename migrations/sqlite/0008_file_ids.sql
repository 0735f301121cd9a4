-- The other IDs a stored file is known by, besides the build-ID it is
-- stored under: its htlhash (the OpenTelemetry eBPF profiler's file ID,
-- computed by the server from the file itself) and its Go build-ID. A file
-- without a GNU build-ID is stored under its own htlhash; a stripped copy
-- of it (same Go build-ID) is stored under the original's key, and its
-- htlhash points there. Query-time symbolization looks up the key of
-- whichever ID a profiler sent.
CREATE TABLE file_ids (
    id_kind    TEXT NOT NULL CHECK (id_kind IN ('htlhash', 'go')),
    file_id    TEXT NOT NULL,
    build_id   TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (id_kind, file_id, build_id)
);
CREATE INDEX file_ids_build_id ON file_ids (build_id);
