"""The shipped digits architecture search (runners/examples/digits_search.yaml), as a user submits
it, on real agents (process runtime) with real PyTorch: made smaller (4 trials, rungs of 1 and 2
epochs) so that it runs in seconds, and otherwise as shipped: trials learn, ASHA promotes one
whose next rung resumes from its checkpoint, and the best trial exports a job that runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import agent_config, learner_space
from tests.controlplane.deployments.serving import serving_cluster
from tests.controlplane.searches.test_search_service import ended, submitted, trials_of
from tests.tenancy import Tokens, auth

SPEC = Path(__file__).resolve().parents[2] / "runners" / "examples" / "digits_search.yaml"

pytestmark = pytest.mark.processes


async def test_the_shipped_digits_search_learns_promotes_and_exports(
    db_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    document: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    document["searcher"] = {**document["searcher"], "min_budget": 1, "reduction": 2}
    document.update(budget={"unit": "epochs", "max": 2}, max_trials=4, max_concurrent_trials=2)
    # One checkpoint directory for both nodes, as a shared volume: a trial promoted onto the
    # other node resumes there too (under each node's own work directory it would start over).
    shared = learner_space() / "checkpoints"
    configs = [
        dataclasses.replace(agent_config(tmp_path, name), checkpoint_dir=shared)
        for name in ("n1", "n2")
    ]
    async with serving_cluster(db_url, tmp_path, configs=configs) as (client, _):
        search_id = await submitted(client, tokens.acme, document)
        search = await ended(client, tokens.acme, search_id, seconds=240)
        assert search["state"] == "completed", search
        trials = await trials_of(client, tokens.acme, search_id)
        # Each trial learned: the digits set is 10 classes, chance is 0.1.
        assert all(t["results"] and t["results"][0]["metric"] > 0.2 for t in trials), trials
        promoted = [t for t in trials if t["rung"] == 1]
        assert promoted, trials
        for trial in promoted:
            logs = await client.get(
                f"/v1/jobs/{trial['job_id']}/logs",
                params={"protocol": "true"},
                headers=auth(tokens.acme),
            )
            # Its rung-1 job resumed at the end of rung 0 (epoch 1) from the trial's checkpoint.
            assert '"kind":"checkpoint_restored","step":1' in await logs.text()
        best = await (
            await client.get(f"/v1/searches/{search_id}/best", headers=auth(tokens.acme))
        ).json()
        assert best["metric"]["value"] == max(t["metric"] for t in promoted)
        job = await client.post("/v1/jobs", json=best["manifest"], headers=auth(tokens.acme))
        assert job.status == 201, await job.text()
