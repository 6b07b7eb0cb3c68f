"""What each rank's device and process did during the timed window: sampled off the critical
path (a background thread, every TELEMETRY_INTERVAL_S, plus one sample at each end of the
window), summarised per rank (mean, min, max, n) in its rank_end record.

- every rank: its process's CPU utilisation (% of one core, from the process's CPU time between
  samples) and resident memory (RSS);
- a cuda rank, on its own board (found by UUID or PCI bus id: dlscale.rank.devices.nvml_handle): GPU
  utilisation, SM clock, device memory used, temperature and power (NVML).

A quantity that cannot be read (no NVML, NotSupported on MIG or some boards, an error during
the window) is recorded as unavailable with NVML's reason; the others are kept. Nothing is
estimated. The per-cell columns (dlscale.analysis.collect: mean over ranks and the lowest or
highest rank)
and the straggler detail read these records.
"""

from __future__ import annotations

import os
import threading
import time

from dlscale.study.protocol import GPU_QUANTITIES, QUANTITIES, TELEMETRY_INTERVAL_S

_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 1e6


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE_MB


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class _Process:
    """CPU utilisation and RSS of this process."""

    def __init__(self):
        self.last = (time.perf_counter(), _cpu_seconds())

    def read(self) -> dict:
        now, cpu = time.perf_counter(), _cpu_seconds()
        (t0, c0), self.last = self.last, (now, cpu)
        values = {"rss_mb": _rss_mb()}
        if now > t0:
            values["cpu_util_pct"] = 100.0 * (cpu - c0) / (now - t0)
        return values


class _Board:
    """NVML readings of one board; a quantity whose read fails is dropped with its reason."""

    def __init__(self, nvml, handle):
        self.nvml, self.handle, self.failed = nvml, handle, {}
        n = nvml
        self.reads = {
            "gpu_util_pct": lambda h: float(n.nvmlDeviceGetUtilizationRates(h).gpu),
            "sm_clock_mhz": lambda h: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "gpu_memory_used_mb": lambda h: n.nvmlDeviceGetMemoryInfo(h).used / 1e6,
            "gpu_temperature_c": lambda h: float(
                n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
            ),
            "gpu_power_w": lambda h: n.nvmlDeviceGetPowerUsage(h) / 1000.0,
        }

    def read(self) -> dict:
        values = {}
        for name, read in list(self.reads.items()):
            try:
                values[name] = read(self.handle)
            except self.nvml.NVMLError as exc:
                self.failed[name] = f"NVML: {exc}"
                del self.reads[name]
        return values


class Telemetry:
    """start() as the timed window opens, stop() as it closes; returns the rank's record:
    {"interval_s", "samples", "method", "quantities": {name: {"mean", "min", "max", "n",
    "unit"}}, "unavailable": {name: reason}}. `gpu`: the rank's board on a cuda rank."""

    def __init__(self, device: str, gpu: dict | None = None, nvml=None):
        self.sources = [_Process()]
        self.unavailable: dict[str, str] = {}
        if device == "cuda":
            try:
                if gpu is None:
                    raise RuntimeError("the rank recorded no GPU")
                if nvml is None:
                    import pynvml as nvml  # nvidia-ml-py: in every GPU environment

                    nvml.nvmlInit()
                from dlscale.rank.devices import nvml_handle

                handle, _ = nvml_handle(nvml, gpu)
                self.sources.append(_Board(nvml, handle))
            except Exception as exc:  # noqa: BLE001 (no NVML: record why)
                reason = f"NVML unavailable: {exc!r}"
                self.unavailable.update(dict.fromkeys(GPU_QUANTITIES, reason))
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        values = {}
        for source in self.sources:
            values.update(source.read())
        self.samples.append(values)

    def _run(self) -> None:
        while not self._stop.wait(TELEMETRY_INTERVAL_S):
            self._sample()

    def start(self) -> None:
        for source in self.sources:
            source.read()  # the process's CPU clock starts here; the board answers once
        self.samples = []
        self._thread = threading.Thread(target=self._run, daemon=True, name="dlscale-telemetry")
        self._thread.start()

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()  # the window's end
        for source in self.sources:
            self.unavailable.update(getattr(source, "failed", {}))
        return summarize(self.samples, self.unavailable)


def summarize(samples: list[dict], unavailable: dict[str, str] | None = None) -> dict:
    """The rank's record from its samples (each a {quantity: value} dict)."""
    quantities = {}
    for name, (unit, _) in QUANTITIES.items():
        values = [s[name] for s in samples if name in s]
        if values:
            quantities[name] = {
                "mean": sum(values) / len(values),
                "min": min(values),
                "max": max(values),
                "n": len(values),
                "unit": unit,
            }
    return {
        "interval_s": TELEMETRY_INTERVAL_S,
        "samples": len(samples),
        "method": f"background thread every {TELEMETRY_INTERVAL_S} s during the timed window "
        "and once at its end (CPU: the process's CPU time and RSS; GPU: NVML on the rank's "
        "board)",
        "quantities": quantities,
        "unavailable": {k: v for k, v in (unavailable or {}).items() if k not in quantities},
    }
