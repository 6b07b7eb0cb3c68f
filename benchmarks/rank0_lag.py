"""Make every rank 0 of a local multi-rank cell lag its peers: SIGSTOP it for 40 ms, let it run
40 ms, over and over, until stopped. A reproduction aid for exit races between ranks (a rank that
leaves while a peer's last collective still pulls from it), not a benchmark of its own.

    timeout 500 python3 benchmarks/rank0_lag.py &   # then run 2-rank cells, e.g. a TF test
"""

import glob
import os
import signal
import time

PAUSE_S = 0.04


def rank0_pids() -> list[int]:
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/cmdline", "rb") as f:
                if b"dlscale.run.train" not in f.read():
                    continue
            with open(d + "/environ", "rb") as f:
                if b"DLSCALE_RANK=0\0" in f.read():
                    pids.append(int(d[len("/proc/") :]))
        except OSError:
            pass
    return pids


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


if __name__ == "__main__":
    while True:
        pids = rank0_pids()
        signal_all(pids, signal.SIGSTOP)
        time.sleep(PAUSE_S)
        signal_all(pids, signal.SIGCONT)
        time.sleep(PAUSE_S)
