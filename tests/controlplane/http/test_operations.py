"""Each route is declared once, as an Operation, from which the router and the OpenAPI document
are both made (test_http.py checks that they agree): what a declaration says beyond its path
agrees with the server too."""

from __future__ import annotations

from controlplane.http.auth import PUBLIC_PATHS, SIGN_IN, STATIC
from controlplane.http.openapi import OPERATIONS


def test_each_operation_is_public_exactly_when_the_server_serves_it_without_a_token() -> None:
    for operation in OPERATIONS:
        public = (
            operation.path in PUBLIC_PATHS
            or operation.path.startswith(STATIC)
            or (operation.path, operation.method) == (SIGN_IN, "post")
        )
        assert operation.public == public, operation.id


def test_operation_ids_are_unique() -> None:
    ids = [operation.id for operation in OPERATIONS]
    assert len(ids) == len(set(ids))
