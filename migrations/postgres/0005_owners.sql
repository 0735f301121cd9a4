-- The tenant that published a file: a token bound to tenants publishes for
-- one of them; '' is shared (a token of every tenant naming none, a trusted
-- loopback client, or a fetch from an upstream server). Listings and source
-- downloads follow the reader's tenants; a bound publisher may not replace
-- what another tenant (or everyone) published.
ALTER TABLE artifacts ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE sources ADD COLUMN owner TEXT NOT NULL DEFAULT '';
