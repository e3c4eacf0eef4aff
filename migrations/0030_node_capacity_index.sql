-- What a node can still give (the `node_capacity` view, read by every claim) sums the CPUs and
-- memory of the node's live allocations. With both partial indexes on live allocations the
-- same estimated size, the planner took the smaller, by tenant, and filtered every live
-- allocation of the fleet by node: 1.5 ms twice a claim with 4,300 learners running on 1,000
-- nodes, growing with the fleet. Carrying the two summed columns, this one is read alone and
-- costs less: 0.11 ms for the whole view's row.
DROP INDEX allocations_active_node;
CREATE INDEX allocations_active_node ON allocations (node) INCLUDE (cpus, memory_mb)
    WHERE released_at IS NULL;
