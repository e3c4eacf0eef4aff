"""Event types, the append-only event store and its gap-free global log."""
