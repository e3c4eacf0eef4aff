"""Trainyard's control plane: event store, projections, HTTP API and lifecycle manager."""

__version__ = "0.1.0"
