"""A resumable job that only counts: for recovery tests and benchmarks, where the training
itself must not load the machine.

    TRAINYARD_CHECKPOINT_DIR=/tmp/ckpt python -m runners.examples.counter --steps 100

Each step sleeps `--step-s`, then prints `step N` (N = steps completed, from 1); the count is
checkpointed with the runner's `Checkpointer` (periodically, on SIGUSR1 and on SIGTERM), and a
restarted run continues after the step it restored. So every attempt's numbered lines run
without a gap from the restored step + 1, and the last attempt's end at `step STEPS`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from runners.checkpoint import Checkpointer
from runners.config import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.examples.counter")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-s", type=float, default=0.05, help="seconds each step takes")
    args = parser.parse_args(argv)
    try:
        # The step is all the state there is, and the checkpointer saves it anyway.
        checkpointer = Checkpointer.from_env({})
    except ConfigError as error:
        parser.error(str(error))
    start = checkpointer.resume()
    with checkpointer:
        for step in range(start, args.steps):
            time.sleep(args.step_s)
            done = step + 1
            print(f"step {done}", flush=True)
            checkpointer.maybe_save(done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
