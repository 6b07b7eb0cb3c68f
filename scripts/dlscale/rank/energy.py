"""Energy over the timed window: NVML's energy counter (or sampled power) of the rank's own
GPU board on NVIDIA GPUs, RAPL counters on CPUs.

Nothing is estimated: a source that cannot be read is recorded as unavailable with the reason.
RAPL counts a whole CPU package (socket), so several ranks of one node see the same joules;
dlscale.store.metrics_summary.summarize counts each node once.
"""

from __future__ import annotations

import glob
import threading
import time

RAPL_GLOB = "/sys/class/powercap/intel-rapl:[0-9]*"
NVML_INTERVAL_S = 0.05
# NVML's power reading on Ampere and newer boards is an average over about 1 s (NVML's
# documentation of nvmlDeviceGetPowerUsage): sampled energy over a shorter window lags the
# window's own power, so such windows are flagged (the counter has no such averaging).
POWER_AVERAGING_S = 1.0


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
    """One GPU board's energy over the window, the board found by UUID or PCI bus id
    (dlscale.rank.devices.nvml_handle; NVML's index is not CUDA's). The difference of NVML's
    total-energy counter (millijoules since the driver loaded; Volta and newer) where the board
    has one; otherwise its power sampled every NVML_INTERVAL_S and integrated from the window's
    start to its end (a sample is taken at both). A read that fails ends the measurement as
    unavailable with NVML's error, never as 0 J."""

    def __init__(self, gpu: dict):
        import pynvml  # nvidia-ml-py: in every GPU environment (envs/*-cuda.txt)

        from dlscale.rank.devices import nvml_handle

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle, lookup = nvml_handle(pynvml, gpu)
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.method = "counter"
        except pynvml.NVMLError:
            self.method = "sampled"
        what = (
            "total-energy counter difference"
            if self.method == "counter"
            else f"power sampled every {NVML_INTERVAL_S} s, integrated"
        )
        self.source = f"nvml (GPU board, {what}; board by {lookup})"
        self.samples: list[tuple[float, float]] = []
        self.error: str | None = None
        self._stop = threading.Event()

    def _power(self) -> tuple[float, float]:
        return time.perf_counter(), self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def _run(self):
        while not self._stop.wait(NVML_INTERVAL_S):
            try:
                self.samples.append(self._power())
            except self.nvml.NVMLError as exc:
                self.error = f"NVML power reading failed during the window: {exc}"
                return

    def start(self):
        if self.method == "counter":
            self.start_mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            return
        self.samples = [self._power()]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self) -> float:
        if self.method == "counter":
            end_mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            if end_mj <= self.start_mj:
                raise EnergyUnavailable(
                    f"NVML's energy counter did not advance over the window ({self.start_mj} "
                    f"-> {end_mj} mJ)"
                )
            return (end_mj - self.start_mj) / 1000.0
        self._stop.set()
        self.thread.join()
        if self.error:
            raise EnergyUnavailable(self.error)
        self.samples.append(self._power())  # the window's end
        s = self.samples
        return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(s, s[1:]))


class EnergyUnavailable(RuntimeError):
    """A meter that started could not finish its reading; the reason is recorded."""


class EnergyMeter:
    """start() before the timed window, stop(samples) after; returns what could be measured.
    `gpu`: the rank's board (dlscale.rank.devices.gpu_identity) on a cuda rank."""

    def __init__(self, device: str, gpu: dict | None = None):
        self.source, self.meter, self.reason = None, None, None
        if device == "cuda":
            try:
                if gpu is None:
                    raise EnergyUnavailable("the rank recorded no GPU")
                self.meter = _Nvml(gpu)
                self.source = self.meter.source
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
            try:
                self.meter.start()
            except Exception as exc:  # noqa: BLE001 (a reading that fails is recorded)
                self.meter, self.reason = None, f"energy reading failed at the start: {exc!r}"
        self.t0 = time.perf_counter()

    def stop(self, samples: int) -> dict:
        seconds = time.perf_counter() - self.t0
        if not self.meter:
            return {"available": False, "reason": self.reason}
        try:
            joules = self.meter.stop()
        except Exception as exc:  # noqa: BLE001 (a reading that fails is recorded)
            return {"available": False, "reason": f"energy reading failed: {exc}"}
        short = getattr(self.meter, "method", None) == "sampled" and seconds < POWER_AVERAGING_S
        return {
            "available": True,
            "source": self.source,
            "joules": joules,
            "seconds": seconds,
            "watts": joules / seconds if seconds else None,
            "joules_per_sample": joules / samples if samples else None,
            "short_window": (
                f"the window ({seconds:.3g} s) is shorter than the board's power averaging "
                f"(about {POWER_AVERAGING_S:g} s): sampled power lags it"
                if short
                else None
            ),
        }
