"""The relation a search runs over: one row per model version, as the model repository's read
model is to provide it (a table or view of its projection). Declared here, apart from
`controlplane.schema`, until the projection's migration creates it; then it moves there, where a
test holds the declaration to the migrated catalog.

What the compiler (`sql`) relies on, beyond the columns' types: `search` is the English
tsvector of title, description and tags in that order (the reference's text, see `reference`);
`metrics` is a JSON object whose values are numbers (the metadata schema's rule: a string there
would make the cast in a metric comparison fail). The indexes that make it fast: GIN on
`search`, GIN (gin_trgm_ops) on `name`, GIN on `tags` and `domains`, b-trees on the other
facets, `version` and `created`."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Integer, MetaData, Table, Text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR

metadata = MetaData()

model_versions_view = Table(
    "model_versions_view",
    metadata,
    Column("name", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("title", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("tags", ARRAY(Text), nullable=False),
    Column("framework", Text),
    Column("domains", ARRAY(Text), nullable=False),
    Column("license", Text),
    Column("version", Integer, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("metrics", JSONB, nullable=False),
    Column("search", TSVECTOR, nullable=False),
)
