"""The tables the control plane's queries rely on, declared once with SQLAlchemy Core.

Migrations are the only way the schema changes; a test builds this declaration and the
migrated schema side by side and requires their catalogs to be identical.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, INET, JSONB, TSVECTOR
from sqlalchemy.types import UserDefinedType


class Xid8(UserDefinedType[int]):
    """Postgres's 64-bit transaction id, which orders the global log."""

    cache_ok = True

    def get_col_spec(self, **_: object) -> str:
        return "xid8"


metadata = MetaData()

events = Table(
    "events",
    metadata,
    Column("position", BigInteger, Identity(always=True), primary_key=True),
    Column("xid", Xid8, nullable=False, server_default=text("pg_current_xact_id()")),
    Column("stream_id", Text, nullable=False),
    Column("stream_version", Integer, nullable=False),
    Column("type", Text, nullable=False),
    Column("schema_version", SmallInteger, nullable=False),
    Column("data", JSONB, nullable=False),
    Column("metadata", JSONB, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("stream_id ~ '^[a-z][a-z0-9_]*-[A-Za-z0-9._:@-]+$'"),
    CheckConstraint("stream_version > 0"),
    CheckConstraint("type <> ''"),
    CheckConstraint("schema_version > 0"),
    CheckConstraint("jsonb_typeof(data) = 'object'"),
    CheckConstraint("jsonb_typeof(metadata) = 'object'"),
    UniqueConstraint("stream_id", "stream_version", name="events_stream_version_key"),
    Index("events_log_order", "xid", "position"),
)

projection_checkpoints = Table(
    "projection_checkpoints",
    metadata,
    Column("name", Text, primary_key=True),
    Column("xid", Xid8, nullable=False, server_default=text("'0'")),
    Column("position", BigInteger, nullable=False, server_default=text("0")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

streams = Table(
    "streams",
    metadata,
    Column("stream_id", Text, primary_key=True),
    Column("category", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("last_type", Text, nullable=False),
    Column("first_position", BigInteger, nullable=False),
    Column("last_position", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("streams_category", "category", "created_at"),
)

schema_migrations = Table(
    "schema_migrations",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("checksum", Text, nullable=False),
    Column("applied_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)


def _manifest(field: str, sql_type: str) -> str:
    return f"((doc -> 'manifest' ->> '{field}')::{sql_type})"


job_status = Table(
    "job_status",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("restarts", Integer, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("labels", JSONB, nullable=False),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("version", Integer, nullable=False),
    Column("doc", JSONB, nullable=False),
    Column("learners", Integer, Computed(_manifest("learners", "integer"), persisted=True)),
    Column(
        "gpus_per_learner",
        Integer,
        Computed(_manifest("gpus_per_learner", "integer"), persisted=True),
    ),
    Column(
        "cpus_per_learner",
        Double,
        Computed(_manifest("cpus", "double precision"), persisted=True),
    ),
    Column(
        "memory_mb_per_learner",
        BigInteger,
        Computed(_manifest("memory_mb", "bigint"), persisted=True),
    ),
    Column("not_before", DateTime(timezone=True)),
    Column(
        "inference",
        Boolean,
        Computed(
            "coalesce(jsonb_typeof(doc -> 'manifest' -> 'inference') = 'object', false)",
            persisted=True,
        ),
    ),
    Column(
        "learners_per_node",
        Integer,
        Computed(_manifest("learners_per_node", "integer"), persisted=True),
    ),
    Index("job_status_tenant_order", "tenant", text("submitted_at DESC"), text("job_id DESC")),
    Index("job_status_order", text("submitted_at DESC"), text("job_id DESC")),
    Index("job_status_tenant_state", "tenant", "state"),
    Index(
        "job_status_running",
        "state",
        postgresql_where=text("state IN ('DEPLOYING', 'DOWNLOADING', 'PROCESSING', 'STORING')"),
    ),
    Index(
        "job_status_live_inference",
        "job_id",
        postgresql_where=text("inference AND state NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')"),
    ),
    Index(
        "job_status_tenant_queue",
        "tenant",
        text("priority DESC"),
        "submitted_at",
        "job_id",
        postgresql_where=text("state = 'QUEUED'"),
    ),
    # Under the fifo claim policy (0043): each tenant's queue by submission time alone.
    Index(
        "job_status_tenant_fifo",
        "tenant",
        "submitted_at",
        "job_id",
        postgresql_where=text("state = 'QUEUED'"),
    ),
    Index(
        "job_status_labels",
        "labels",
        postgresql_using="gin",
        postgresql_ops={"labels": "jsonb_path_ops"},
    ),
)

job_history = Table(
    "job_history",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("position", BigInteger, nullable=False),
    Column("event", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", Text, nullable=False),
    Column("reason", Text),
)

job_counts = Table(
    "job_counts",
    metadata,
    Column("labels", JSONB, primary_key=True),
    Column("tenant", Text, primary_key=True),
    Column("state", Text, primary_key=True),
    Column("n", BigInteger, nullable=False),
    Column("cpus", Numeric(24, 6), nullable=False),
    Column("memory_mb", BigInteger, nullable=False),
    CheckConstraint("n > 0"),
)

tenants = Table(
    "tenants",
    metadata,
    Column("name", Text, primary_key=True),
    Column("weight", Double, nullable=False),
    Column("gpu_quota", Integer),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("limits", JSONB),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("token_sha256", Text, primary_key=True),
    Column("token_id", Text, nullable=False, unique=True),
    Column("tenant", Text),
    Column("is_admin", Boolean, nullable=False),
    Column("issued_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True)),
    CheckConstraint("(tenant IS NULL) = is_admin"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", Text, primary_key=True),
    Column("agent_id", Uuid, nullable=False),
    Column("state", Text, nullable=False),
    Column("lease_until", DateTime(timezone=True), nullable=False),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("runtime", Text, nullable=False),
    Column("cpus", Double, nullable=False),
    Column("memory_mb", BigInteger, nullable=False),
    Column("draining", Boolean, nullable=False, server_default=text("false")),
    Column("address", INET),
    Column("job_plan", Text),
    CheckConstraint("state IN ('READY', 'GONE', 'LOST')"),
    CheckConstraint("cpus > 0"),
    CheckConstraint("memory_mb > 0"),
)

node_gpus = Table(
    "node_gpus",
    metadata,
    Column("node", Text, ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True),
    Column("index", Integer, primary_key=True, autoincrement=False),
    Column("uuid", Text, nullable=False, unique=True),
    Column("model", Text, nullable=False),
    Column("memory_mb", BigInteger, nullable=False),
    Column("healthy", Boolean, nullable=False),
    Column("health_reason", Text),
)

allocations = Table(
    "allocations",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("learner", Integer, primary_key=True, autoincrement=False),
    Column("tenant", Text, nullable=False),
    Column("node", Text, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("gpus", ARRAY(Text), nullable=False),
    Column("cpus", Double, nullable=False),
    Column("memory_mb", BigInteger, nullable=False),
    Column("allocated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("released_at", DateTime(timezone=True)),
    Index(
        "allocations_active_node",
        "node",
        postgresql_include=["cpus", "memory_mb"],
        postgresql_where=text("released_at IS NULL"),
    ),
    Index("allocations_active_tenant", "tenant", postgresql_where=text("released_at IS NULL")),
    Index("allocations_released", "released_at", postgresql_where=text("learner = 0")),
)

allocated_gpus = Table(
    "allocated_gpus",
    metadata,
    Column("gpu_uuid", Text, primary_key=True),
    Column("job_id", Uuid, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("learner", Integer, nullable=False),
)

job_logs = Table(
    "job_logs",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("learner", Integer, primary_key=True, autoincrement=False),
    Column("stream", Text, primary_key=True),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("id", BigInteger, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("line", Text, nullable=False),
    # Its job's tenant, for the search across a tenant's logs (migration 0034); NULL for a job
    # job_status does not know. The search's indexes are job_log_search's (migration 0035).
    Column("tenant", Text),
    CheckConstraint("attempt > 0"),
    CheckConstraint("learner >= 0"),
    CheckConstraint("stream IN ('stdout', 'stderr', 'system')"),
    CheckConstraint("seq > 0"),
    CheckConstraint("id > 0"),
    UniqueConstraint("job_id", "id", name="job_logs_cursor_key"),
)

# The searchable copy of every line with a tenant, filled behind the writers by the indexer
# (migration 0035). Its trigram index exists only where the server has pg_trgm and btree_gin,
# so it is not declared here but named in SERVER_DEPENDENT_INDEXES.
job_log_search = Table(
    "job_log_search",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("tenant", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("learner", Integer, nullable=False),
    Column("stream", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("line", Text, nullable=False),
    Index("job_log_search_order", "tenant", "at", "job_id", "id"),
)

# The ranges of lines stored but not yet copied into job_log_search (migration 0035).
job_log_search_queue = Table(
    "job_log_search_queue",
    metadata,
    Column("entry", BigInteger, Identity(always=True), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("job_id", Uuid, nullable=False),
    Column("first_id", BigInteger, nullable=False),
    Column("last_id", BigInteger, nullable=False),
    Index("job_log_search_queue_tenant", "tenant"),
)

job_log_heads = Table(
    "job_log_heads",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("last_id", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("job_log_heads_quiet", "updated_at"),
)

job_log_series = Table(
    "job_log_series",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("learner", Integer, primary_key=True, autoincrement=False),
    Column("stream", Text, primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
)

webhook_secrets = Table(
    "webhook_secrets",
    metadata,
    Column("secret_id", Text, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("secret", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("retired_at", DateTime(timezone=True)),
    Index(
        "webhook_secrets_current",
        "tenant",
        unique=True,
        postgresql_where=text("retired_at IS NULL"),
    ),
)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("delivery_id", Uuid, primary_key=True),
    Column("position", BigInteger, nullable=False, unique=True),
    # NULL for a model's notification; `stream` says where each attempt is recorded.
    Column("job_id", Uuid),
    Column("tenant", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column(
        "next_attempt_at", DateTime(timezone=True), nullable=False, server_default=text("now()")
    ),
    Column("claim", Uuid),
    Column("last_status", Integer),
    Column("last_error", Text),
    Column("finished_at", DateTime(timezone=True)),
    Column("stream", Text, nullable=False),
    CheckConstraint("state IN ('pending', 'delivered', 'failed')"),
    CheckConstraint("attempts >= 0"),
    Index("webhook_deliveries_due", "next_attempt_at", postgresql_where=text("state = 'pending'")),
    Index("webhook_deliveries_job", "job_id"),
)

job_secret_env = Table(
    "job_secret_env",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("env", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

model_versions = Table(
    "model_versions",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("artifact_sha256", Text, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("title", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("tags", ARRAY(Text), nullable=False),
    Column("domains", ARRAY(Text), nullable=False),
    Column("framework", Text, nullable=False),
    Column("license", Text, nullable=False),
    Column("metrics", JSONB, nullable=False),
    Column("job_id", Uuid),
    Column("metadata", JSONB, nullable=False),
    Column("metadata_schema", Integer, nullable=False),
    Column("visibility", Text, nullable=False),
    Column("deprecated", Text),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("published_by", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("search", TSVECTOR, nullable=False),
    Column("name_trigrams", ARRAY(Text), nullable=False),
    Index("model_versions_search", "search", postgresql_using="gin"),
    Index("model_versions_name_trigrams", "name_trigrams", postgresql_using="gin"),
    Index("model_versions_tags", "tags", postgresql_using="gin"),
    Index("model_versions_domains", "domains", postgresql_using="gin"),
    Index("model_versions_framework", "framework"),
    Index("model_versions_license", "license"),
    Index(
        "model_versions_order",
        text("created DESC"),
        text("tenant DESC"),
        text("name DESC"),
        text("version DESC"),
    ),
    Index(
        "model_versions_public",
        text("created DESC"),
        postgresql_where=text("visibility = 'public'"),
    ),
    Index("model_versions_artifact", "artifact_sha256"),
    Index("model_versions_job", "job_id", postgresql_where=text("job_id IS NOT NULL")),
)
"""One row per model version: what the model search (`controlplane.models.query`) runs over.

What the search's compiler relies on, beyond the columns' types: `search` is the English
tsvector of title, description and tags in that order (the reference's text, see
`controlplane.models.query.reference`); `metrics` is a JSON object whose values are numbers (the
metadata schema's rule: a string there would make the cast in a metric comparison fail);
`name_trigrams` holds every trigram of the lower-cased name (`search.sql.trigrams`)."""

model_aliases = Table(
    "model_aliases",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("alias", Text, primary_key=True),
    Column("version", Integer, nullable=False),
)

deployments = Table(
    "deployments",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("model_tenant", Text, nullable=False),
    Column("model_name", Text, nullable=False),
    Column("reference", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("artifact_sha256", Text, nullable=False),
    Column("entry_point", Text, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("replicas", Integer, nullable=False),
    Column("replica_jobs", ARRAY(Uuid), nullable=False),
    Column("deleted", Boolean, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("canary_version", Integer),
    Column("canary_weight", Integer),
    Column("canary_jobs", ARRAY(Uuid), nullable=False, server_default=text("'{}'::uuid[]")),
    Column("canary_rollback", JSONB),
    Column("canary_started_at", DateTime(timezone=True)),
    CheckConstraint("canary_weight BETWEEN 0 AND 100"),
    Index(
        "deployments_live",
        "tenant",
        "name",
        postgresql_where=text("NOT deleted OR cardinality(replica_jobs) > 0"),
    ),
)

pipelines = Table(
    "pipelines",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    Column("steps", ARRAY(Text), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

serving_tasks = Table(
    "serving_tasks",
    metadata,
    Column("task_id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("pipeline", Text),
    Column("steps", ARRAY(Text), nullable=False),
    Column("step", Integer, nullable=False, server_default=text("0")),
    Column("deployment", Text, nullable=False),
    Column("items", Integer, nullable=False),
    Column("input", JSONB, nullable=False),
    Column("state", Text, nullable=False),
    Column("output", JSONB),
    Column("error", Text),
    Column("memo", Text, nullable=False),
    Column("memo_key", LargeBinary),
    Column("claim", Uuid),
    Column("replica", Uuid),
    Column("claimed_at", DateTime(timezone=True)),
    Column("tries", Integer, nullable=False, server_default=text("0")),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("step_times", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("version", Integer),
    CheckConstraint("cardinality(steps) >= 1"),
    CheckConstraint("items >= 1"),
    CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed')"),
    CheckConstraint("memo IN ('hit', 'miss', 'off')"),
    Index(
        "serving_tasks_queued",
        "tenant",
        "deployment",
        "submitted_at",
        postgresql_where=text("state = 'queued'"),
    ),
    Index("serving_tasks_running", "claimed_at", postgresql_where=text("state = 'running'")),
    Index("serving_tasks_deployment", "tenant", "deployment", "submitted_at"),
    Index("serving_tasks_finished", "finished_at"),
    Index("serving_tasks_deployment_finished", "tenant", "deployment", "finished_at"),
)
"""The serving task queue (controlplane/deployments/tasks.py, node_agent/serving.py)."""

serving_batches = Table(
    "serving_batches",
    metadata,
    Column("batch_id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("deployment", Text, nullable=False),
    Column("replica", Uuid, nullable=False),
    Column("tasks", Integer, nullable=False),
    Column("items", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("invocation_ms", Double, nullable=False),
    Column("inference_ms", Double),
    Column("at", DateTime(timezone=True), nullable=False),
    CheckConstraint("reason IN ('full', 'timeout', 'idle')"),
    CheckConstraint("outcome IN ('succeeded', 'failed')"),
    Index("serving_batches_deployment", "tenant", "deployment", "at"),
)

serving_memo = Table(
    "serving_memo",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("deployment", Text, primary_key=True),
    Column("key", LargeBinary, primary_key=True),
    Column("output", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("used_at", DateTime(timezone=True), nullable=False),
    Index("serving_memo_used", "tenant", "deployment", "used_at"),
)

serving_channels = Table(
    "serving_channels",
    metadata,
    Column("replica", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("deployment", Text, nullable=False),
    Column("node", Text, nullable=False),
    Column("address", Text, nullable=False),
    Column("token", Text, nullable=False),
    Column("offered_at", DateTime(timezone=True), nullable=False),
    Index("serving_channels_deployment", "tenant", "deployment"),
)

inference_jobs = Table(
    "inference_jobs",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("deployment", Text, nullable=False),
    Column("weight", Double, nullable=False),
    Column("batch_size", Integer, nullable=False),
    Column("queries", BigInteger),
    Column("input", JSONB, nullable=False),
    Column("started", BigInteger, nullable=False, server_default=text("0")),
    Column("vtime", Double, nullable=False, server_default=text("0")),
    Column("done", Boolean, nullable=False, server_default=text("false")),
    Column("load_error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("weight > 0"),
    CheckConstraint("batch_size >= 1"),
    CheckConstraint("queries >= 1"),
    Index("inference_jobs_live", "job_id", postgresql_where=text("NOT done")),
)
"""Inference jobs' queries and fair time (controlplane/inference, node_agent/inference.py)."""

inference_replicas = Table(
    "inference_replicas",
    metadata,
    Column(
        "job_id", Uuid, ForeignKey("inference_jobs.job_id", ondelete="CASCADE"), primary_key=True
    ),
    Column("replica", Uuid, primary_key=True),
    Column("node", Text, nullable=False),
    Column("seen_at", DateTime(timezone=True), nullable=False),
    Index("inference_replicas_seen", "seen_at"),
)

inference_queries = Table(
    "inference_queries",
    metadata,
    Column(
        "job_id", Uuid, ForeignKey("inference_jobs.job_id", ondelete="CASCADE"), primary_key=True
    ),
    Column("index", BigInteger, primary_key=True),
    Column("state", Text, nullable=False),
    Column("claim", Uuid),
    Column("replica", Uuid, nullable=False),
    Column("node", Text, nullable=False),
    Column("tries", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("claimed_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("inference_ms", Double),
    Column("output", JSONB),
    Column("error", Text),
    CheckConstraint("index >= 0"),
    CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed')"),
    CheckConstraint("tries >= 1"),
    Index("inference_queries_queued", "job_id", "index", postgresql_where=text("state = 'queued'")),
    Index("inference_queries_running", "replica", postgresql_where=text("state = 'running'")),
    Index("inference_queries_claimed", "claimed_at", postgresql_where=text("state = 'running'")),
    Index(
        "inference_queries_finished",
        "job_id",
        "finished_at",
        postgresql_where=text("finished_at IS NOT NULL"),
    ),
)

pending_reasons = Table(
    "pending_reasons",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("queued", Boolean, nullable=False),
    Column("position", Integer),
    Column("kinds", ARRAY(Text), nullable=False),
    Column("reasons", JSONB, nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("estimated_start", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("recorded", Boolean, nullable=False, server_default=text("true")),
    CheckConstraint("version >= 0"),
    CheckConstraint("position >= 1"),
    Index("pending_reasons_queued", "job_id", postgresql_where=text("queued")),
)

scheduling_policy = Table(
    "scheduling_policy",
    metadata,
    Column("one", Boolean, primary_key=True, server_default=text("true")),
    Column("claim_order", Text, nullable=False),
    Column("quotas", Boolean, nullable=False),
    Column("set_by", Text, nullable=False),
    Column("set_at", DateTime(timezone=True), nullable=False),
    Column("reason", Text),
    CheckConstraint("one"),
    CheckConstraint("claim_order IN ('fair_share', 'priority', 'fifo')"),
)

pending_rounds = Table(
    "pending_rounds",
    metadata,
    Column("one", Boolean, primary_key=True, server_default=text("true")),
    Column("writer", Uuid, nullable=False),
    Column("round", BigInteger, nullable=False),
    CheckConstraint("one"),
)

pending_spans = Table(
    "pending_spans",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("reason", Text, primary_key=True),
    Column("blocking", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), primary_key=True),
    Column("ended_at", DateTime(timezone=True)),
    CheckConstraint("blocking IN ('never', 'waiting')"),
    Index("pending_spans_open", "job_id", postgresql_where=text("ended_at IS NULL")),
)

pending_left = Table(
    "pending_left",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("left_at", DateTime(timezone=True), nullable=False),
)

searches = Table(
    "searches",
    metadata,
    Column("search_id", Uuid, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("searcher", Text, nullable=False),
    Column("metric", Text, nullable=False),
    Column("mode", Text, nullable=False),
    Column("max_trials", Integer, nullable=False),
    Column("rungs", Integer, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("labels", JSONB, nullable=False),
    Column("trials", Integer, nullable=False, server_default=text("0")),
    Column("best_trial", Integer),
    Column("best_rung", Integer),
    Column("best_metric", Double),
    Column("reason", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    CheckConstraint("state IN ('running', 'completed', 'failed', 'cancelled')"),
    CheckConstraint("mode IN ('max', 'min')"),
    CheckConstraint("rungs >= 1"),
    Index("searches_tenant_created", "tenant", text("created_at DESC"), "search_id"),
    Index("searches_running", "search_id", postgresql_where=text("state = 'running'")),
)

search_trials = Table(
    "search_trials",
    metadata,
    Column("search_id", Uuid, primary_key=True),
    Column("number", Integer, primary_key=True),
    Column("job_id", Uuid, nullable=False),
    Column("rung", Integer, nullable=False),
    Column("budget", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("point", JSONB, nullable=False),
    Column("results", JSONB, nullable=False),
    Column("metric", Double),
    Column("parent", Integer),
    Column("reason", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    CheckConstraint("number >= 0"),
    CheckConstraint("state IN ('running', 'paused', 'completed', 'failed', 'pruned', 'cancelled')"),
    Index(
        "search_trials_live",
        "search_id",
        postgresql_where=text("state IN ('running', 'cancelled')"),
    ),
)

ui_sessions = Table(
    "ui_sessions",
    metadata,
    Column("session_sha256", Text, primary_key=True),
    Column("token_sha256", Text, nullable=False),
    Column("csrf", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    Index("ui_sessions_expires", "expires_at"),
)

identity_sessions = Table(
    "identity_sessions",
    metadata,
    Column("session_sha256", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("email", Text),
    Column("tenant", Text),
    Column("is_admin", Boolean, nullable=False),
    Column("csrf", Text),
    Column("refresh_token", Text),
    Column("provider_expires_at", DateTime(timezone=True), nullable=False),
    Column("checked_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    Column("end_reason", Text),
    Column("handoff_challenge", Text),
    CheckConstraint("kind IN ('browser', 'cli')"),
    CheckConstraint("(tenant IS NULL) = is_admin"),
    Index("identity_sessions_expires", "expires_at"),
)

identity_logins = Table(
    "identity_logins",
    metadata,
    Column("state", Text, primary_key=True),
    Column("binding_sha256", Text, nullable=False),
    Column("verifier", Text, nullable=False),
    Column("nonce", Text, nullable=False),
    Column("cli_redirect", Text),
    Column("cli_challenge", Text),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

warm_uids = Table(
    "warm_uids",
    metadata,
    Column("placeholder", Uuid, primary_key=True),
    Column("node", Text, nullable=False),
    Column("uid", BigInteger, nullable=False),
    Column("made_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Index("warm_uids_node", "node"),
)


SERVER_DEPENDENT_INDEXES = frozenset({"job_log_search_trigrams"})
"""Indexes the migrations make only where the server has the extensions they need (0035's
trigram index: pg_trgm and btree_gin); a catalog compared with this declaration leaves them out."""
