-- Which part of a segment holds a trace, so that the trace view and
-- trace_id= flamegraphs read (a ranged read) and decode only the parts of
-- the services the trace ran in. A range is 16 bytes: offset and length,
-- u64 little-endian. NULL: the whole segment (version 1, or written before
-- this column). Keep the sqlite/ and postgres/ copies in step.
-- Level 0: for the entries of trace_ids (which lists an ID once per part
-- holding it), a u16 LE part count, the parts' ranges, then each entry's
-- part number (u16 LE): server/src/store/meta/trace_index.rs.
ALTER TABLE profile_segments ADD COLUMN trace_parts BYTEA;
-- Compacted segments: the ranges of the parts holding the trace.
ALTER TABLE profile_traces ADD COLUMN parts BYTEA;
