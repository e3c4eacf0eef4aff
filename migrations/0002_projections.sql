-- Projection checkpoints and the first read model.

-- Where each projection has read the global log up to, written in the same transaction as its
-- read model so that every event is applied exactly once.
CREATE TABLE projection_checkpoints (
    name       text PRIMARY KEY,
    xid        xid8 NOT NULL DEFAULT '0',
    position   bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row per stream: what exists, how far it has got, and when it last changed.
CREATE TABLE streams (
    stream_id      text PRIMARY KEY,
    category       text NOT NULL,
    version        integer NOT NULL,
    last_type      text NOT NULL,
    first_position bigint NOT NULL,
    last_position  bigint NOT NULL,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL
);
CREATE INDEX streams_category ON streams (category, created_at);

GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON projection_checkpoints, streams
    TO trainyard_app;
