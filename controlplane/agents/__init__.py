"""The control plane's side of node agents: leases, claims, fencing and the lifecycle manager."""
