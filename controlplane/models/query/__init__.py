"""Model search, pure: the one query language the API's `q` and `trainyard models search` share
(`query`: parse and print it; `nodes`: its syntax tree), a reference evaluation over plain
records (`reference`), and its compilation into a SQLAlchemy Core WHERE clause (`sql`) over the
model repository's read model (`schema.model_versions`). No I/O and no database driver here."""
