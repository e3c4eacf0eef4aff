"""The front door: the `trainyard` command (`cli.main`), and `trainyard up` with its demo, which
run the server and an agent together. It imports every part; no part imports it."""
