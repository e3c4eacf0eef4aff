"""The web dashboard: its sessions and its static assets, served by the control plane."""
