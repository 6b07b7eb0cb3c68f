"""Energy over the timed window: NVML power sampling on NVIDIA GPUs, RAPL counters on CPUs.

Nothing is estimated: a source that cannot be read is recorded as unavailable with the reason.
RAPL counts a whole CPU package (socket), so several ranks of one node see the same joules;
dlscale.metrics.summarize counts each node once.
"""

from __future__ import annotations

import glob
import threading
import time

RAPL_GLOB = "/sys/class/powercap/intel-rapl:[0-9]*"
NVML_INTERVAL_S = 0.05


class _Rapl:
    """Package-level RAPL energy counters (microjoules, wrapping at max_energy_range_uj)."""

    def __init__(self):
        self.domains = []
        for path in sorted(glob.glob(RAPL_GLOB)):
            try:
                with open(f"{path}/energy_uj") as fh:
                    int(fh.read())
                with open(f"{path}/max_energy_range_uj") as fh:
                    wrap = int(fh.read())
            except (OSError, ValueError):
                continue
            self.domains.append((path, wrap))
        self.start_values = None

    def _read(self):
        values = []
        for path, _ in self.domains:
            with open(f"{path}/energy_uj") as fh:
                values.append(int(fh.read()))
        return values

    def start(self):
        self.start_values = self._read()

    def stop(self) -> float:
        joules = 0.0
        for (_, wrap), a, b in zip(self.domains, self.start_values, self._read()):
            joules += ((b - a) % wrap) / 1e6
        return joules


class _Nvml:
    """Power of one GPU sampled every NVML_INTERVAL_S, integrated over the window."""

    def __init__(self, index: int):
        import pynvml  # nvidia-ml-py; only present in GPU environments

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()

    def _run(self):
        while not self._stop.is_set():
            watts = self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
            self.samples.append((time.perf_counter(), watts))
            self._stop.wait(NVML_INTERVAL_S)

    def start(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self) -> float:
        self._stop.set()
        self.thread.join()
        s = self.samples
        return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(s, s[1:]))


class EnergyMeter:
    """start() before the timed window, stop(samples) after; returns what could be measured."""

    def __init__(self, device: str, local_rank: int):
        self.source, self.meter, self.reason = None, None, None
        if device == "cuda":
            try:
                self.meter, self.source = _Nvml(local_rank), "nvml (GPU board power)"
            except Exception as exc:  # noqa: BLE001 (no NVML: record why)
                self.reason = f"NVML unavailable: {exc!r}"
        else:
            rapl = _Rapl()
            if rapl.domains:
                self.meter, self.source = rapl, "rapl (CPU package, whole node)"
            else:
                self.reason = "RAPL counters not readable (no /sys/class/powercap/intel-rapl:*)"

    def start(self) -> None:
        if self.meter:
            self.meter.start()
        self.t0 = time.perf_counter()

    def stop(self, samples: int) -> dict:
        seconds = time.perf_counter() - self.t0
        if not self.meter:
            return {"available": False, "reason": self.reason}
        joules = self.meter.stop()
        return {
            "available": True,
            "source": self.source,
            "joules": joules,
            "seconds": seconds,
            "watts": joules / seconds if seconds else None,
            "joules_per_sample": joules / samples if samples else None,
        }
