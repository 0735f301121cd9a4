-- Profiles: one row per stored segment (an object in the blob store), one
-- per (segment, service, profile type), the label pairs found in each, and
-- trace IDs → segments. Keep the sqlite/ and postgres/ copies in step.
CREATE TABLE profile_segments (
    tenant     TEXT NOT NULL,
    sha256     TEXT NOT NULL REFERENCES blobs (sha256),
    size       BIGINT NOT NULL,
    start_ns   BIGINT NOT NULL,
    end_ns     BIGINT NOT NULL,
    points     BIGINT NOT NULL,   -- events: timestamps, or values without timestamps
    level      INTEGER NOT NULL,  -- 0 = as ingested, 1 = compacted
    created_at BIGINT NOT NULL,   -- unix milliseconds
    PRIMARY KEY (tenant, sha256)
);
CREATE INDEX profile_segments_sha256 ON profile_segments (sha256);
CREATE INDEX profile_segments_level ON profile_segments (level, tenant, start_ns);
CREATE INDEX profile_segments_end ON profile_segments (end_ns);

CREATE TABLE profile_series (
    tenant       TEXT NOT NULL,
    sha256       TEXT NOT NULL,
    service      TEXT NOT NULL,
    profile_type TEXT NOT NULL,   -- sample_type:unit:period_type:unit
    start_ns     BIGINT NOT NULL,
    end_ns       BIGINT NOT NULL,
    points       BIGINT NOT NULL,
    total        BIGINT NOT NULL,  -- sum of values (1 per timestamp without values)
    PRIMARY KEY (tenant, sha256, service, profile_type),
    FOREIGN KEY (tenant, sha256) REFERENCES profile_segments (tenant, sha256) ON DELETE CASCADE
);
CREATE INDEX profile_series_lookup ON profile_series (tenant, service, profile_type, start_ns);

-- Label pairs per (segment, service). value '' = the name had more distinct
-- values in the segment than the cardinality guard indexes.
CREATE TABLE profile_labels (
    tenant  TEXT NOT NULL,
    sha256  TEXT NOT NULL,
    service TEXT NOT NULL,
    name    TEXT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (tenant, sha256, service, name, value),
    FOREIGN KEY (tenant, sha256) REFERENCES profile_segments (tenant, sha256) ON DELETE CASCADE
);
CREATE INDEX profile_labels_name ON profile_labels (tenant, name, value);

CREATE TABLE profile_traces (
    tenant   TEXT NOT NULL,
    trace_id TEXT NOT NULL,   -- 32 lowercase hex digits
    sha256   TEXT NOT NULL,
    PRIMARY KEY (tenant, trace_id, sha256),
    FOREIGN KEY (tenant, sha256) REFERENCES profile_segments (tenant, sha256) ON DELETE CASCADE
);
CREATE INDEX profile_traces_segment ON profile_traces (tenant, sha256);

-- Leases for jobs that one replica at a time should run (the compactor).
CREATE TABLE leases (
    name       TEXT PRIMARY KEY NOT NULL,
    holder     TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
