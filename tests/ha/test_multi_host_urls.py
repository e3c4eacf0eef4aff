"""libpq's multi-host URL (docs/failover.md) is taken everywhere a database URL is: in messages,
in the URLs of agents' logins, and by `trainyard agent install`."""

from __future__ import annotations

import pytest

from controlplane.agents.login_cli import agent_url
from controlplane.database import describe
from node_agent.systemd import check_database_url, mask_password

URL = "postgresql://owner:secret@db1:5432,db2:5433/trainyard?target_session_attrs=read-write"


def test_messages_name_every_host_and_never_the_password() -> None:
    assert describe(URL) == "db1:5432,db2:5433/trainyard"


def test_an_agent_login_url_keeps_every_host_and_the_session_attributes() -> None:
    assert agent_url(URL, "ty_agent_n1", password="pw") == (
        "postgresql://ty_agent_n1:pw@db1:5432,db2:5433/trainyard?target_session_attrs=read-write"
    )


def test_agent_install_takes_a_multi_host_url() -> None:
    check_database_url(URL)
    assert "secret" not in mask_password(URL)


def test_agent_install_refuses_a_bad_port_of_any_host() -> None:
    with pytest.raises(ValueError, match="cannot be parsed"):
        check_database_url("postgresql://u@db1:5432,db2:x/trainyard")
