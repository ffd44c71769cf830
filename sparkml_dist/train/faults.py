"""Deliberate failures for chaos tests (see `train.job.Fault`)."""

from __future__ import annotations

import os
import signal
import time

from sparkml_dist.train.job import Fault


def inject(faults: tuple[Fault, ...], attempt: int, rank: int, epoch: int, step: int) -> None:
    for f in faults:
        if f.rank != rank or f.attempt != attempt:
            continue
        if f.kind == "slow":
            time.sleep(f.seconds)
        elif f.kind == "kill" and (f.epoch, f.step) == (epoch, step):
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.kind == "hang" and (f.epoch, f.step) == (epoch, step):
            time.sleep(f.seconds or 3600)  # alive but silent: the others' collectives time out
