-- The append-only event store: the source of truth for every job, node and tenant.

-- The application runs as this role (the pool sets it for every session). It may read and
-- append events, never change or remove them.
DO $$
BEGIN
    CREATE ROLE trainyard_app NOLOGIN;
EXCEPTION
    -- Roles are cluster-wide; another database of the same cluster may have created it.
    WHEN duplicate_object THEN NULL;
END
$$;

GRANT USAGE ON SCHEMA public TO trainyard_app;

CREATE TABLE events (
    -- Unique and increasing within one transaction, but NOT in commit order: readers of the
    -- global log order by (xid, position) and stop below the oldest running transaction.
    position       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    xid            xid8 NOT NULL DEFAULT pg_current_xact_id(),
    stream_id      text NOT NULL CHECK (stream_id ~ '^[a-z][a-z0-9_]*-[A-Za-z0-9._:@-]+$'),
    stream_version integer NOT NULL CHECK (stream_version > 0),
    type           text NOT NULL CHECK (type <> ''),
    schema_version smallint NOT NULL CHECK (schema_version > 0),
    data           jsonb NOT NULL CHECK (jsonb_typeof(data) = 'object'),
    metadata       jsonb NOT NULL CHECK (jsonb_typeof(metadata) = 'object'),
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT events_stream_version_key UNIQUE (stream_id, stream_version)
);

-- The global log is read in (xid, position) order.
CREATE INDEX events_log_order ON events (xid, position);

CREATE FUNCTION events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: % on % is refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- The triggers hold even for the table's owner and superusers, who bypass privileges.
CREATE TRIGGER events_append_only
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_refuse_change();
CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();

REVOKE ALL ON events FROM PUBLIC;
GRANT SELECT, INSERT ON events TO trainyard_app;
