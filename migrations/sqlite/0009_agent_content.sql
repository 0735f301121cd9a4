-- Files an agent published are bound to the content they were taken from:
-- the SHA-256 of the whole file as the agent found it on its host (for an
-- uploaded executable, the blob's own hash; for a symbol-table extract of
-- a larger file, the hash the agent computed). The server names a frame
-- from an agent's file only when the frame's mapping carries that hash, so
-- a forged file under a real build-ID names only its forger's frames.
-- Empty for files CI or an upstream server published.
ALTER TABLE artifacts ADD COLUMN content_sha256 TEXT NOT NULL DEFAULT '';
UPDATE artifacts SET content_sha256 = sha256
    WHERE origin = 'agent' AND kind = 'executable';
CREATE INDEX artifacts_agent_content ON artifacts (build_id, content_sha256)
    WHERE origin = 'agent';
-- Claims are leases named after the file (and its content): those that
-- ran out are deleted by the collector; this finds them.
CREATE INDEX leases_expires ON leases (expires_at);
-- A file's other IDs (htlhash, Go build-ID) lead to its key for every
-- frame when a CI or upstream file carries them (agent_content ''), and
-- only for frames of that content when an agent's file does: a file an
-- agent published with a copied Go build-ID note must not lead anyone
-- else's frames to its key (where a CI file would name them). Rows written
-- before: an agent's when only agents' files are stored under the key
-- ('none' when their content is not known: it matches no frame).
CREATE TABLE file_ids_bound (
    id_kind       TEXT NOT NULL CHECK (id_kind IN ('htlhash', 'go')),
    file_id       TEXT NOT NULL,
    build_id      TEXT NOT NULL,
    agent_content TEXT NOT NULL DEFAULT '',
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (id_kind, file_id, build_id, agent_content)
);
INSERT INTO file_ids_bound (id_kind, file_id, build_id, agent_content, created_at)
SELECT f.id_kind, f.file_id, f.build_id,
    CASE WHEN EXISTS (SELECT 1 FROM artifacts a
                     WHERE a.build_id = f.build_id AND a.origin <> 'agent') THEN ''
         ELSE COALESCE((SELECT MIN(NULLIF(a.content_sha256, '')) FROM artifacts a
                        WHERE a.build_id = f.build_id AND a.origin = 'agent'), 'none')
    END,
    f.created_at
FROM file_ids f;
DROP TABLE file_ids;
ALTER TABLE file_ids_bound RENAME TO file_ids;
CREATE INDEX file_ids_build_id ON file_ids (build_id);
