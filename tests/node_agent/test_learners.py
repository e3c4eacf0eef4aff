"""What an agent runs for a claimed attempt: where its learners keep checkpoints, and which one
a restarted attempt resumes from, on this node or on another one."""

from __future__ import annotations

import json
from ipaddress import IPv4Address
from pathlib import Path
from uuid import UUID, uuid4

from cli.main import parser
from controlplane.clock import SYSTEM_CLOCK
from controlplane.jobs.lifecycle import Checkpoint, Job, JobStatus, Submit, decide, replay
from controlplane.jobs.locations import Roots
from controlplane.jobs.manifest import HparamsSpec, JobManifest, TrialSpec
from controlplane.scheduling.claim import Claim
from controlplane.scheduling.placement import Capacity, LearnerAllocation, place
from controlplane.scheduling.unschedulable import demand_of
from controlplane.settings import Settings
from node_agent.cli import config_from
from node_agent.containers import container_config
from node_agent.job_links import DEFAULT_RANGE, INSIDE, AddressPlan, job_link
from node_agent.learners import learner_specs
from node_agent.networks import joins_network, network_name
from node_agent.runtime import LearnerSpec, learner_env
from runners import config as runner_env
from runners.config import (
    BUDGET,
    BUDGET_UNIT,
    CHECKPOINT_DIR,
    DATA_DIR,
    HPARAMS,
    RESUME_FROM,
    TRIAL,
)

MANIFEST = JobManifest.model_validate({"name": "j", "image": "i", "command": ["train"]})


def submitted() -> Job:
    job = replay(
        decide(Submit(job_id=uuid4(), tenant="t", manifest=MANIFEST, at=SYSTEM_CLOCK.now()), None)
    )
    assert job is not None
    return job


JOB = submitted()


def spec(node: str, work_dir: Path, checkpoint_root: Path, checkpoint: Path | None) -> LearnerSpec:
    """Learner 0 of the job's attempt 1, or, after `checkpoint`, of its attempt 2."""
    last = None
    if checkpoint is not None:
        last = Checkpoint(
            attempt=1, step=40, path=str(checkpoint), size_bytes=1, at=SYSTEM_CLOCK.now()
        )
    attempt = 1 if checkpoint is None else 2
    job = JOB.model_copy(
        update={"state": JobStatus.DEPLOYING, "attempt": attempt, "last_checkpoint": last}
    )
    claim = Claim(job, attempt, epoch=attempt, learners=[LearnerAllocation(0, node, [])], version=3)
    [only] = learner_specs(
        claim, node=node, work_dir=work_dir, checkpoint_root=checkpoint_root, launcher=["run"]
    )
    return only


def test_a_job_moved_off_a_lost_node_resumes_from_a_shared_checkpoint_directory(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "nfs"
    first = spec("a", tmp_path / "a", shared, None)
    saved = Path(first.env[CHECKPOINT_DIR]) / "ckpt-00000001.pt"
    assert saved.is_relative_to(shared)
    moved = spec("b", tmp_path / "b", shared, saved)
    assert moved.env[CHECKPOINT_DIR] == first.env[CHECKPOINT_DIR]
    assert moved.env[RESUME_FROM] == str(saved)


def test_checkpoints_under_a_node_s_work_directory_resume_only_on_that_node(
    tmp_path: Path,
) -> None:
    first = spec("a", tmp_path / "a", tmp_path / "a", None)
    saved = Path(first.env[CHECKPOINT_DIR]) / "ckpt-00000001.pt"
    assert spec("a", tmp_path / "a", tmp_path / "a", saved).env[RESUME_FROM] == str(saved)
    # Node b cannot read node a's disk: its learner starts over rather than fail on the path.
    assert RESUME_FROM not in spec("b", tmp_path / "b", tmp_path / "b", saved).env


def test_relative_agent_directories_become_absolute() -> None:
    # A learner reads the paths in its environment from its own working directory: relative
    # ones would put its checkpoints (and its exit status) where no later attempt looks.
    options = ["agent", "--name", "a", "--work-dir", "work", "--checkpoint-dir", "ckpt"]
    config = config_from(parser().parse_args(options), Settings(Path("home"), None), "process")
    assert (config.work_dir, config.checkpoint_dir) == (Path.cwd() / "work", Path.cwd() / "ckpt")
    default = config_from(
        parser().parse_args(["agent", "--name", "a"]), Settings(Path("h"), None), "process"
    )
    assert default.work_dir == Path.cwd() / "h" / "agents" / "a"


def test_no_path_the_tenant_names_is_a_mount_source_or_a_folder_of_the_agent(
    tmp_path: Path,
) -> None:
    manifest = JobManifest.model_validate(
        {
            "name": "j",
            "image": "i",
            "command": ["train"],
            "data": {"source": "file:///srv/data/t/set", "mount_path": "/etc/systemd/x"},
            "results": {"location": "file:///etc/cron.d/r"},
        }
    )
    job = JOB.model_copy(update={"manifest": manifest, "state": JobStatus.DEPLOYING})
    claim = Claim(job, 1, epoch=1, learners=[LearnerAllocation(0, "a", [])], version=3)
    work = tmp_path / "work"
    for container in (True, False):
        [only] = learner_specs(
            claim,
            node="a",
            work_dir=work,
            checkpoint_root=work,
            launcher=["run"],
            roots=Roots(data=("/srv/data/{tenant}",)),
            user=(200001, 200001),
            container=container,
        )
        # Every mount's source and every folder the agent makes is its own, under its work
        # directory; `mount_path` is only where a container sees its data folder.
        assert all(m.source.is_relative_to(work) for m in only.mounts)
        assert all(f.path.is_relative_to(work) and f.base == work for f in only.folders)
        targets = {m.target for m in only.mounts}
        assert (Path("/etc/systemd/x") in targets) is container
        assert only.env[DATA_DIR] == ("/etc/systemd/x" if container else str(only.workdir / "data"))
        # The file:// locations are checked against the roots on the node before use.
        assert [(s.path, s.field, s.writable) for s in only.shared] == [
            (Path("/srv/data/t/set"), "data.source", False),
            (Path("/etc/cron.d/r"), "results.location", True),
        ]
        assert only.user == (200001, 200001)


def test_a_reported_checkpoint_that_climbs_out_of_the_job_s_folder_is_not_resumed(
    tmp_path: Path,
) -> None:
    # The path in a checkpoint event is the learner's report: `..` must not lead a later
    # attempt into another job's checkpoints.
    first = spec("a", tmp_path, tmp_path, None)
    climbing = Path(first.env[CHECKPOINT_DIR]) / ".." / ".." / ".." / "other-job" / "ckpt.pt"
    assert RESUME_FROM not in spec("a", tmp_path, tmp_path, climbing).env


def test_a_search_trial_s_rungs_share_its_checkpoints_and_get_their_hyperparameters(
    tmp_path: Path,
) -> None:
    search, first_job = uuid4(), uuid4()

    def rung(number: int, job_id: UUID) -> LearnerSpec:
        manifest = MANIFEST.model_copy(
            update={
                "hparams": HparamsSpec(values={"lr": 0.1}, budget=3**number, unit="epochs"),
                "trial": TrialSpec(
                    search_id=search, number=7, rung=number, checkpoints_of=first_job
                ),
            }
        )
        job = JOB.model_copy(
            update={"job_id": job_id, "manifest": manifest, "state": JobStatus.DEPLOYING}
        )
        claim = Claim(job, 1, epoch=1, learners=[LearnerAllocation(0, "a", [])], version=3)
        [only] = learner_specs(
            claim, node="a", work_dir=tmp_path, checkpoint_root=tmp_path / "ckpt", launcher=["r"]
        )
        return only

    zero, one = rung(0, first_job), rung(1, uuid4())
    # The promoted rung's job writes and resumes where the trial's first job kept its own.
    assert one.env[CHECKPOINT_DIR] == zero.env[CHECKPOINT_DIR]
    assert Path(zero.env[CHECKPOINT_DIR]).is_relative_to(tmp_path / "ckpt" / str(first_job))
    # ... and takes over the files the earlier rung's user left there.
    adopting = [f.adopt for f in one.folders if f.path == Path(one.env[CHECKPOINT_DIR])]
    assert adopting == [True]
    assert not any(f.adopt for f in zero.folders)
    assert json.loads(one.env[HPARAMS]) == {"lr": 0.1}
    assert (one.env[BUDGET], one.env[BUDGET_UNIT], one.env[TRIAL]) == ("3", "epochs", "7")
    assert HPARAMS not in spec("a", tmp_path, tmp_path, None).env


def test_each_learner_gets_its_place_in_the_job_s_process_group(tmp_path: Path) -> None:
    manifest = MANIFEST.model_copy(update={"learners": 3, "rendezvous_timeout_s": 7.5})
    job = JOB.model_copy(update={"state": JobStatus.DEPLOYING, "manifest": manifest})
    placed = [
        LearnerAllocation(0, "a", []),
        LearnerAllocation(1, "b", []),
        LearnerAllocation(2, "a", []),
    ]
    claim = Claim(job, 1, epoch=1, learners=placed, version=3)

    def env_on(node: str, *, container: bool = False) -> list[dict[str, str]]:
        specs = learner_specs(
            claim,
            node=node,
            work_dir=tmp_path,
            checkpoint_root=tmp_path / "ckpt",
            launcher=["run"],
            container=container,
        )
        return [learner_env(each, path=None) for each in specs]

    first, third = env_on("a")
    [second] = env_on("b")
    port = first["MASTER_PORT"]
    assert 29500 <= int(port) < 31500
    assert {k: first[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == {
        "RANK": "0",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert (third["RANK"], third["LOCAL_RANK"], third["NODE_RANK"]) == ("2", "1", "0")
    assert (second["RANK"], second["LOCAL_RANK"], second["NODE_RANK"]) == ("1", "0", "1")
    for env in (first, second, third):
        # Every rank meets at one address and port, under torch's names and their twins.
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", port)
        assert env[runner_env.MASTER_PORT] == port and env[runner_env.RANK] == env["RANK"]
        assert env[runner_env.RENDEZVOUS_TIMEOUT_S] == "7.5"
    # Containers meet rank 0's container on their job's network, by its attempt's alias.
    assert env_on("b", container=True)[0]["MASTER_ADDR"] == "learner-0-attempt-1"
    # The next attempt meets at a port of its own.
    later = Claim(job.model_copy(update={"attempt": 2}), 2, epoch=2, learners=placed, version=4)
    specs = learner_specs(
        later, node="a", work_dir=tmp_path, checkpoint_root=tmp_path / "ckpt", launcher=["run"]
    )
    assert learner_env(specs[0], path=None)["MASTER_PORT"] != port


def test_learners_per_node_gives_each_node_that_many_local_ranks_in_node_order(
    tmp_path: Path,
) -> None:
    manifest = MANIFEST.model_copy(update={"learners": 6, "learners_per_node": 2})
    job = JOB.model_copy(update={"state": JobStatus.DEPLOYING, "manifest": manifest})
    # As the claim places it: room for all six on "c", which takes two, as do "a" and "b".
    rooms = [Capacity(node, [], 64.0, 1 << 20) for node in ("c", "a", "b")]
    placed = place(demand_of(manifest), rooms)
    assert placed is not None
    claim = Claim(job, 1, epoch=1, learners=placed, version=3)
    envs = [
        learner_env(each, path=None)
        for node in ("a", "b", "c")
        for each in learner_specs(
            claim, node=node, work_dir=tmp_path, checkpoint_root=tmp_path / "ckpt", launcher=["run"]
        )
    ]
    names = ("RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
    assert sorted(tuple(int(env[name]) for name in names) for env in envs) == [
        (node_rank * 2 + local_rank, local_rank, node_rank, 2, 6)
        for node_rank in range(3)
        for local_rank in range(2)
    ]
    assert [env["NODE_RANK"] for env in envs[4:]] == ["0", "0"]  # the claiming node's first


def test_ranks_across_nodes_meet_at_rank_0_s_job_address_over_the_job_s_interface(
    tmp_path: Path,
) -> None:
    manifest = MANIFEST.model_copy(update={"learners": 3})
    job = JOB.model_copy(update={"state": JobStatus.DEPLOYING, "manifest": manifest})
    placed = [
        LearnerAllocation(0, "a", []),
        LearnerAllocation(1, "b", []),
        LearnerAllocation(2, "a", []),
    ]
    claim = Claim(job, 1, epoch=1, learners=placed, version=3)
    plan = AddressPlan.parse(DEFAULT_RANGE)
    addresses = {"a": "192.0.2.1", "b": "192.0.2.2"}

    def on(node: str) -> list[LearnerSpec]:
        # Each node computes its link alone, from the job's uid index (5 here).
        link = job_link(plan, 5, claim.nodes, node, addresses)
        return learner_specs(
            claim,
            node=node,
            work_dir=tmp_path,
            checkpoint_root=tmp_path / "ckpt",
            launcher=["run"],
            link=link,
        )

    specs = [*on("a"), *on("b")]
    assert [spec.link.address if spec.link else None for spec in specs] == [
        IPv4Address("10.224.0.161"),
        IPv4Address("10.224.0.161"),
        IPv4Address("10.224.0.162"),
    ]
    for spec in specs:
        env = learner_env(spec, path=None)
        assert env["MASTER_ADDR"] == "10.224.0.161"  # rank 0's node's address for the job
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == INSIDE


def test_every_rank_reads_the_checkpoints_of_rank_0_which_alone_writes_them(
    tmp_path: Path,
) -> None:
    manifest = MANIFEST.model_copy(update={"learners": 2})
    job = JOB.model_copy(update={"state": JobStatus.DEPLOYING, "manifest": manifest})
    placed = [LearnerAllocation(0, "a", []), LearnerAllocation(1, "a", [])]
    claim = Claim(job, 1, epoch=1, learners=placed, version=3)
    root = tmp_path / "ckpt"
    chief, other = learner_specs(
        claim, node="a", work_dir=tmp_path, checkpoint_root=root, launcher=["run"]
    )
    chief_dir = Path(chief.env[CHECKPOINT_DIR])
    assert [(m.source, m.writable) for m in chief.mounts] == [(chief_dir, True)]
    assert (chief_dir, False) in [(m.source, m.writable) for m in other.mounts]
    assert chief_dir in [folder.path for folder in other.folders]


def test_a_container_of_a_job_that_trains_together_joins_its_network_under_its_rank_s_alias(
    tmp_path: Path,
) -> None:
    manifest = MANIFEST.model_copy(update={"learners": 2})
    job = JOB.model_copy(update={"state": JobStatus.DEPLOYING, "manifest": manifest})
    placed = [LearnerAllocation(0, "a", []), LearnerAllocation(1, "a", [])]
    claim = Claim(job, 3, epoch=1, learners=placed, version=3)
    _, second = learner_specs(
        claim,
        node="a",
        work_dir=tmp_path,
        checkpoint_root=tmp_path / "ckpt",
        launcher=["run"],
        container=True,
        user=(1000, 1000),
    )
    network = network_name(job.job_id)
    assert joins_network(second) and not second.network  # its tenant has no network
    config = container_config(second, request_gpus=False, network=network)
    assert config["NetworkingConfig"] == {
        "EndpointsConfig": {network: {"Aliases": ["learner-1-attempt-3"]}}
    }
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["MASTER_ADDR"] == "learner-0-attempt-3"
    # A learner alone without the network has none at all, as before.
    [alone] = learner_specs(
        Claim(JOB, 1, epoch=1, learners=placed[:1], version=3),
        node="a",
        work_dir=tmp_path,
        checkpoint_root=tmp_path / "ckpt",
        launcher=["run"],
        container=True,
    )
    assert not joins_network(alone)
