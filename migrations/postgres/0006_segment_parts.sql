-- Segments laid out by series (format version 2): each (segment, service,
-- profile type) row records the byte range of its part, so a query of one
-- service reads only that range. NULL: a version-1 segment, read whole.
-- Keep the sqlite/ and postgres/ copies in step.
ALTER TABLE profile_series ADD COLUMN part_offset BIGINT;
ALTER TABLE profile_series ADD COLUMN part_size BIGINT;
