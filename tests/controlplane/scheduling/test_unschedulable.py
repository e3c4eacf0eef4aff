"""Whether a job could ever be placed, for a job that asks for `learners_per_node`: each of its
nodes must hold that many learners' share at once, and it needs learners / learners_per_node
live nodes."""

from __future__ import annotations

from controlplane.scheduling.placement import Demand
from controlplane.scheduling.unschedulable import LiveNodes, out_of_bounds, unschedulable_reason

LIVE = LiveNodes(nodes=2, gpus=4, cpus=8.0, memory_mb=16384, total_gpus=8)


def test_a_job_whose_learners_fit_one_by_one_but_not_per_node_can_never_be_placed() -> None:
    # Eight one-GPU learners fit the two nodes' eight GPUs; four to a node too, not eight.
    assert unschedulable_reason(Demand(8, 1, 1.0, 1024), LIVE) is None
    assert unschedulable_reason(Demand(8, 1, 1.0, 1024, 4), LIVE) is None
    assert unschedulable_reason(Demand(8, 1, 1.0, 1024, 8), LIVE) == (
        "needs 8 healthy GPU(s) for its 8 learners on each node; the largest node has 4"
    )
    assert unschedulable_reason(Demand(2, 0, 5.0, 1024, 2), LIVE) == (
        "needs 10 CPUs for its 2 learners on each node; the largest node has 8"
    )
    assert unschedulable_reason(Demand(2, 0, 1.0, 10000, 2), LIVE) == (
        "needs 20000 MiB of memory for its 2 learners on each node; the largest node has 16384 MiB"
    )


def test_a_job_needing_more_nodes_than_are_live_says_so() -> None:
    assert unschedulable_reason(Demand(3, 0, 1.0, 1024, 1), LIVE) == (
        "needs 3 nodes (1 of its 3 learners on each); the live nodes are 2"
    )
    # Without learners_per_node, three learners share the two nodes.
    assert unschedulable_reason(Demand(3, 0, 1.0, 1024), LIVE) is None


def test_a_stored_learners_per_node_that_does_not_divide_the_learners_is_out_of_bounds() -> None:
    assert out_of_bounds(Demand(4, 0, 1.0, 1024, 2)) is None
    assert out_of_bounds(Demand(4, 0, 1.0, 1024, 3)) == (
        "its learners_per_node 3 does not divide its 4 learners"
    )
    assert out_of_bounds(Demand(4, 0, 1.0, 1024, 0)) is not None
