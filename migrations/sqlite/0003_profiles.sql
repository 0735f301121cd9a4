-- Profiles: one row per stored segment (an object in the blob store), one
-- per (segment, service, profile type) with the label values found there,
-- and trace IDs → segments. Keep the sqlite/ and postgres/ copies in step.
-- Rows are kept narrow (integer segment IDs, binary trace IDs): ingest
-- writes a row per linked trace of every export.
CREATE TABLE profile_segments (
    id         INTEGER PRIMARY KEY,
    tenant     TEXT NOT NULL,
    sha256     TEXT NOT NULL REFERENCES blobs (sha256),
    size       BIGINT NOT NULL,
    start_ns   BIGINT NOT NULL,
    end_ns     BIGINT NOT NULL,
    points     BIGINT NOT NULL,   -- events: timestamps, or values without timestamps
    level      INTEGER NOT NULL,  -- 0 = as ingested, 1 = compacted
    created_at BIGINT NOT NULL,   -- unix milliseconds
    -- Level 0 only: the linked trace IDs, 16 bytes each, sorted. Compacted
    -- segments list them in profile_traces instead (see below).
    trace_ids  BLOB,
    UNIQUE (tenant, sha256)
);
CREATE INDEX profile_segments_sha256 ON profile_segments (sha256);
CREATE INDEX profile_segments_level ON profile_segments (level, tenant, start_ns);
CREATE INDEX profile_segments_end ON profile_segments (end_ns);

CREATE TABLE profile_series (
    segment_id   BIGINT NOT NULL REFERENCES profile_segments (id) ON DELETE CASCADE,
    tenant       TEXT NOT NULL,
    service      TEXT NOT NULL,
    profile_type TEXT NOT NULL,   -- sample_type:unit:period_type:unit
    start_ns     BIGINT NOT NULL,
    end_ns       BIGINT NOT NULL,
    points       BIGINT NOT NULL,
    total        BIGINT NOT NULL, -- sum of values (1 per timestamp without values)
    -- JSON {"name": ["value", ...]}: the label values in these samples;
    -- null for a name with more values than the cardinality guard indexes.
    labels       TEXT NOT NULL,
    PRIMARY KEY (segment_id, service, profile_type)
);
CREATE INDEX profile_series_lookup ON profile_series (tenant, service, profile_type, start_ns);

-- Trace ID → compacted segments. Written once per compacted window in one
-- sorted batch: a row per trace at every ingest would be a random B-tree
-- insert each (measured: most of the ingest cost, through page writes).
CREATE TABLE profile_traces (
    trace_id   BLOB NOT NULL,
    segment_id BIGINT NOT NULL REFERENCES profile_segments (id) ON DELETE CASCADE,
    PRIMARY KEY (trace_id, segment_id)
) WITHOUT ROWID;
CREATE INDEX profile_traces_segment ON profile_traces (segment_id);

-- Leases for jobs that one replica at a time should run (the compactor).
CREATE TABLE leases (
    name       TEXT PRIMARY KEY NOT NULL,
    holder     TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
