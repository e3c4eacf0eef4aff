"""Parsing the environment the node agent sets: every rule, without processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners.config import (
    CHECKPOINT_DIR,
    CHECKPOINT_INTERVAL,
    CHECKPOINT_KEEP,
    DATA_DIR,
    DATA_SHA256,
    DATA_URI,
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_CHECKPOINT_KEEP,
    RESULTS_DIR,
    RESULTS_URI,
    RESUME_FROM,
    CheckpointConfig,
    ConfigError,
    DataSource,
    LaunchConfig,
    Results,
    load_checkpoint_config,
    load_launch_config,
)

DIGEST = "ab" * 32


def test_an_empty_environment_asks_for_nothing() -> None:
    assert load_launch_config({}) == LaunchConfig(data=None, results=None, checkpoint_dir=None)


def test_a_full_environment_is_read_into_the_launch_config() -> None:
    config = load_launch_config(
        {
            DATA_URI: "https://example.org/set.tar",
            DATA_SHA256: DIGEST.upper(),
            DATA_DIR: "/job/data",
            RESULTS_DIR: "/job/results",
            RESULTS_URI: "file:///store/job-1",
            CHECKPOINT_DIR: "/job/checkpoints",
        }
    )

    assert config == LaunchConfig(
        data=DataSource(
            uri="https://example.org/set.tar", sha256=DIGEST, directory=Path("/job/data")
        ),
        results=Results(directory=Path("/job/results"), uri="file:///store/job-1"),
        checkpoint_dir=Path("/job/checkpoints"),
    )
    assert config.output_directories() == [Path("/job/results"), Path("/job/checkpoints")]


def test_empty_values_count_as_unset() -> None:
    config = load_launch_config({DATA_URI: "", DATA_SHA256: " ", RESULTS_URI: ""})

    assert config == LaunchConfig(data=None, results=None, checkpoint_dir=None)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({DATA_URI: "s3://bucket/set", DATA_DIR: "/d"}, "unsupported URI scheme 's3'"),
        ({DATA_URI: "/plain/path", DATA_DIR: "/d"}, "has no scheme"),
        ({DATA_URI: "file://otherhost/x", DATA_DIR: "/d"}, "only local files"),
        ({DATA_URI: "file:///", DATA_DIR: "/d"}, "absolute path below the root"),
        ({DATA_URI: "file:///x"}, f"{DATA_DIR} must be set"),
        ({DATA_SHA256: DIGEST}, f"{DATA_URI} is not"),
        ({DATA_URI: "file:///x", DATA_DIR: "/d", DATA_SHA256: "abc"}, "64 hexadecimal"),
        ({RESULTS_URI: "http://store/x", RESULTS_DIR: "/r"}, "unsupported URI scheme 'http'"),
        ({RESULTS_URI: "file:///store/x"}, f"{RESULTS_DIR} must be set"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_KEEP: "none"}, f"{CHECKPOINT_KEEP} must be"),
    ],
)
def test_bad_launch_configuration_is_a_clear_error(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_launch_config(environ)


def test_checkpoint_config_has_defaults_for_the_tunables() -> None:
    assert load_checkpoint_config({CHECKPOINT_DIR: "/ck"}) == CheckpointConfig(
        directory=Path("/ck"),
        interval_seconds=DEFAULT_CHECKPOINT_INTERVAL_S,
        keep=DEFAULT_CHECKPOINT_KEEP,
        resume_from=None,
    )


def test_checkpoint_config_reads_every_variable() -> None:
    config = load_checkpoint_config(
        {
            CHECKPOINT_DIR: "/ck",
            CHECKPOINT_INTERVAL: "0.5",
            CHECKPOINT_KEEP: "7",
            RESUME_FROM: "/ck/ckpt-00000003.pt",
        }
    )

    assert config == CheckpointConfig(
        directory=Path("/ck"),
        interval_seconds=0.5,
        keep=7,
        resume_from=Path("/ck/ckpt-00000003.pt"),
    )


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, f"{CHECKPOINT_DIR} must be set"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_INTERVAL: "5m"}, "positive number of seconds"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_INTERVAL: "0"}, "positive number of seconds"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_INTERVAL: "nan"}, "positive number of seconds"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_INTERVAL: "inf"}, "positive number of seconds"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_KEEP: "0"}, "at least 1"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_KEEP: "2.5"}, "at least 1"),
        ({CHECKPOINT_DIR: "/ck", CHECKPOINT_KEEP: "²"}, "at least 1"),
    ],
)
def test_bad_checkpoint_configuration_is_a_clear_error(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_checkpoint_config(environ)
