"""Tenants and their bearer tokens: events, the read model that authenticates requests, the
service that creates tenants and issues tokens, and the principals that tokens authenticate."""
