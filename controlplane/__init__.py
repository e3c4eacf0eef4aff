"""Trainyard's control plane: event store, projections, HTTP API and lifecycle manager."""
