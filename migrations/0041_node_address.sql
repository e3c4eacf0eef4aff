-- A node's address on the cluster network, as its agent advertises it (`--node-address`) with
-- each registration: the other nodes route a job's addresses on it there when the job's
-- learners span nodes (node_agent/job_links.py). NULL: its agent gave none, and jobs whose
-- learners span it get no network across nodes.
ALTER TABLE nodes ADD COLUMN address inet;

-- AGENT RIGHTS: an agent records its own node's address as it registers (the row's policies
-- keep it to its own node's row); every agent reads them all, as it reads the nodes.
GRANT UPDATE (address) ON nodes TO trainyard_agent;
