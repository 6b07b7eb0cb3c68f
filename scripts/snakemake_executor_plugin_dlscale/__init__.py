"""dlscale's Snakemake executor plugin: the official Slurm executor with two additions.

Snakemake finds it as it finds every executor plugin, by the module name's prefix
`snakemake_executor_plugin_` (snakemake_interface_executor_plugins.registry); its name is the
rest, `dlscale`: `executor: dlscale` in profiles/slurm, or `--executor dlscale`. It subclasses
`snakemake_executor_plugin_slurm.Executor` and overrides its methods; nothing of the Slurm
plugin's objects is replaced at run time, and of Snakemake's one function only: its reader of
`--config` entries (`snakemake.cli.parse_config`), which this module, imported when Snakemake
builds its command-line parser under any profile, wraps so that a target typed after `--config`
is refused in one line with the command that works instead of a traceback
(dlscale.workflow.config_option; every KEY=VALUE entry is Snakemake's own reader's). The logic
lives in dlscale:

- `format_job_exec`: a cell's job runs its launcher directly, with no Snakemake inside the
  allocation (dlscale.workflow.jobstep); every other job keeps the plugin's own command.
- `check_active_jobs`: the plugin's own, then its status poll interval grown by the setting
  `dlscale-status-backoff-factor` instead of the plugin's +10 s per poll that saw no job finish,
  and bounded by `dlscale-max-seconds-between-status-checks` (the plugin's bound: 180 s, fixed).
- `run_jobs` (first), `check_active_jobs`, `report_job_error`: each cell is held behind its
  hardware entry's preflight, refused after a failed one, and its error says why
  (dlscale.workflow.preflight, started at the workflow's onstart).
- `run_jobs`, `format_job_exec`, `report_job_submission`, `report_job_error`,
  `check_active_jobs`: with config `pack`, the ready cells of one hardware entry and
  environment are submitted as packs, one allocation each, and each packed cell is reported
  from its pack runner's state (dlscale.workflow.packing); the allocation itself is submitted
  by the Slurm plugin's own `run_job`.
- `run_jobs`, `report_job_submission`, `report_job_success`, `cancel_jobs`: a study survives its
  driver (dlscale.workflow.resume: adoption of an earlier driver's jobs, the submission journal,
  SIGHUP/SIGINT/SIGTERM). Resume starts at the workflow's onstart (`start_study`, called by
  `dlscale.workflow.resume.start`), before the first job; until then, and in a workflow that
  never calls it, each method is the Slurm plugin's own.

Settings: the Slurm plugin's, unchanged, under this plugin's name: Snakemake prefixes a
plugin's settings with its name, so `--slurm-logdir` is `--dlscale-logdir` here (profile key
`dlscale-logdir`, environment `SNAKEMAKE_DLSCALE_LOGDIR`).
tests/unit/workflow/test_executor_contract.py pins every base method this class overrides or calls.
"""

# no `from __future__ import annotations`: Snakemake reads the settings' field types as types
import sys
from dataclasses import dataclass, field
from typing import Optional

from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings as SlurmExecutorSettings
from snakemake_executor_plugin_slurm import common_settings
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from dlscale.workflow import jobstep, packing, resume
from dlscale.workflow.config_option import refuse_targets_after_config

__all__ = ["Executor", "ExecutorSettings", "common_settings"]

refuse_targets_after_config()

NAME = "dlscale"


@dataclass
class ExecutorSettings(SlurmExecutorSettings):
    """The Slurm plugin's settings, each named `dlscale-<setting>` on the command line and in a
    profile (`slurm-<setting>` under the official plugin), and one of dlscale's own."""

    max_seconds_between_status_checks: Optional[int] = field(  # noqa: UP045 (a type Snakemake calls)
        default=180,
        metadata={
            "help": "Upper bound in seconds of the status poll interval: the Slurm plugin "
            "adds 10 s after every poll that finds no job finished, up to 180 s (its own, "
            "fixed bound). A lower bound here keeps a finished job from waiting that long to "
            "be seen, at one squeue per this many seconds at most.",
            "env_var": False,
            "required": False,
        },
    )
    status_backoff_factor: Optional[float] = field(  # noqa: UP045 (a type Snakemake calls)
        default=None,
        metadata={
            "help": "Grow the status poll interval by this factor after a poll that finds no "
            "job finished (from the init interval: 2, 3, 4.5, ... s at 1.5), instead of the "
            "Slurm plugin's 10 s per such poll; still bounded by max-seconds-between-status-"
            "checks. A cell that ends a few seconds after a poll is then seen within seconds, "
            "not 12 s or more. Unset: the plugin's own step.",
            "env_var": False,
            "required": False,
        },
    )


def misnamed_options(argv: list[str]) -> list[str]:
    """Options of the official plugin (`--slurm-...`) on the command line: under this executor
    Snakemake parses them into the other plugin's settings and this one never sees them."""
    return [
        a.split("=", 1)[0]
        for a in argv
        if a.startswith("--slurm-") and not a.startswith("--slurm-jobstep-")
    ]


class Executor(SlurmExecutor):
    preflight = None  # dlscale.workflow.preflight.Preflight, set at onstart (Slurm route)
    pack = None  # cells per pack (config `pack`; 0: as many as fit; None: off), at onstart
    pack_concurrent = True  # config pack_steps: a pack's cells side by side (concurrent)

    def __post_init__(self, test_mode: bool = False):
        misnamed = misnamed_options(sys.argv[1:])
        if misnamed and self.workflow.is_main_process:
            raise WorkflowError(
                f"dlscale: executor '{NAME}' takes the Slurm plugin's settings under its own "
                f"name: {', '.join(o.replace('--slurm-', f'--{NAME}-', 1) for o in misnamed)} "
                f"(not {', '.join(misnamed)}, which would be ignored). No job was started."
            )
        super().__post_init__(test_mode=test_mode)
        self.thin, self.route = jobstep.route(self.workflow)
        self.resume: resume.Resume | None = None
        self.packer: packing.Packer | None = None  # config `pack`, read at the first jobs
        resume.register(self)

    # -- the job path: no Snakemake inside a cell's allocation -------------------------------
    def format_job_exec(self, job) -> str:
        if isinstance(job, packing.PackJob):
            return job.command(sys.executable)
        return jobstep.command(job, self.thin, super().format_job_exec)

    # -- packs (dlscale.workflow.packing) --------------------------------------------------
    def submit_jobs(self, jobs):
        """Submit jobs that no earlier driver's job covers: the packable cells as packs (config
        `pack`), every other job as the Slurm plugin does."""
        if self.pack is not None and not self.thin:
            self.logger.warning(f"dlscale: pack is ignored: {self.route}")
        elif self.pack is not None:
            jobs = self.packer_of().submit(list(jobs), jobstep.thin_eligible, self.submit_pack)
        if jobs:
            super().run_jobs(jobs)

    def submit_pack(self, pack: packing.PackJob) -> None:
        self.logger.info("dlscale: " + "\n".join(pack.plan) + f"\n  (manifest: {pack.manifest})")
        for _, job in pack.members:
            self.run_job_pre(job)
        self._job_submission_executor.submit(self.run_job, pack)  # the plugin's own sbatch

    def _pack_members(self, job_info, external_jobid=None):
        pack = job_info.job
        study_dir = pack.manifest.parent.parent.parent.parent
        logfile = job_info.aux.get("slurm_logfile") if job_info.aux else None
        for slot, job in pack.members:
            aux = packing.packed_aux(study_dir, pack.pack_id, slot, logfile)
            yield SubmittedJobInfo(job, external_jobid=external_jobid, aux=aux)

    # -- status polling: the plugin's poll, its back-off grown by a factor and bounded ----
    async def check_active_jobs(self, active_jobs):
        settings = self.workflow.executor_settings
        before = self.next_seconds_between_status_checks
        if self.preflight is not None:
            self.preflight.poll()  # each preflight's result said once, when it arrives
        packed = [j for j in active_jobs if packing.is_packed(j)]
        if packed:
            running, ended = self.packer_of().check(packed, resume.job_states, resume.LIVE_STATES)
            for job_info in running:
                yield job_info
            for job_info, why in ended:
                if why is None:
                    self.report_job_success(job_info)
                else:
                    self.report_job_error(job_info, msg=f"dlscale: packed cell {why}")
            active_jobs = [j for j in active_jobs if not packing.is_packed(j)]
        async for job_info in super().check_active_jobs(active_jobs):
            yield job_info
        after = self.next_seconds_between_status_checks
        if packed and ended:  # a packed cell ended: poll again soon, as the plugin does
            after = settings.init_seconds_before_status_checks
        # the plugin backed off (no job finished: before + 10 s) or reset (some finished)
        if settings.status_backoff_factor and after > before:
            after = round(max(before * settings.status_backoff_factor, before + 1), 1)
        bound = settings.max_seconds_between_status_checks
        if bound and bound > 0 and after > bound:
            after = bound
        self.next_seconds_between_status_checks = after

    # -- resume ----------------------------------------------------------------------------
    def start_study(
        self, study_dir: str, mode: str, pack: bool | int = False, pack_steps: str = "concurrent"
    ) -> resume.Resume:
        """onstart, in the driver, before the first job: plan the adoption of earlier drivers'
        jobs and handle the signals; from then on the methods below journal and adopt, and
        pack the cells with the study's `pack` and `pack_steps` settings."""
        self.pack = packing.pack_setting({"pack": pack})
        self.pack_concurrent = packing.pack_steps_setting({"pack_steps": pack_steps})
        self.resume = resume.Resume(
            self.workflow,
            self,
            study_dir,
            mode,
            resume.PluginCalls(
                run_jobs=self.submit_jobs,
                report_job_submission=super().report_job_submission,
                report_job_success=super().report_job_success,
                cancel_jobs=super().cancel_jobs,
            ),
        )
        self.resume.plan()
        self.resume.handle_signals()
        return self.resume

    def packer_of(self) -> packing.Packer:
        """The packer (an adopted packed cell needs one even where this run packs nothing)."""
        if self.packer is None:
            self.packer = packing.Packer(self, self.pack or 0, self.pack_concurrent)
        return self.packer

    def run_jobs(self, jobs):
        if self.preflight is not None:  # cells held behind their entry's preflight
            jobs = self.preflight.hold(jobs, self._refuse)
        if self.resume is None:
            return self.submit_jobs(jobs)
        return self.resume.run_jobs(jobs)

    # -- the preflight (dlscale.workflow.preflight) ----------------------------------------
    def _refuse(self, job, text: str) -> None:
        """A cell whose entry's preflight failed: not submitted; its error says why."""
        self.report_job_error(SubmittedJobInfo(job), msg=f"dlscale: {text}")

    def report_job_error(self, job_info, msg=None, **kwargs):
        if isinstance(job_info.job, packing.PackJob):  # the pack's sbatch failed: each cell
            for member in self._pack_members(job_info):
                self.report_job_error(member, msg=msg, **kwargs)
            return None
        why = None if self.preflight is None else self.preflight.explain(job_info.job)
        if why and (msg is None or why not in msg):
            msg = f"{msg}\ndlscale: {why}" if msg else f"dlscale: {why}"
        return super().report_job_error(job_info, msg=msg, **kwargs)

    def report_job_submission(self, job_info, register_job: bool = True):
        if isinstance(job_info.job, packing.PackJob):  # one allocation: each cell submitted
            packing.record_allocation(job_info.job.manifest.parent, job_info.external_jobid)
            for member in self._pack_members(job_info, job_info.external_jobid):
                self.report_job_submission(member, register_job=register_job)
            return None
        if self.resume is None:
            return super().report_job_submission(job_info, register_job=register_job)
        return self.resume.report_job_submission(job_info, register_job=register_job)

    def report_job_success(self, job_info):
        if self.resume is None:
            return super().report_job_success(job_info)
        return self.resume.report_job_success(job_info)

    def cancel_jobs(self, active_jobs):
        if self.resume is None:
            return super().cancel_jobs(active_jobs)
        return self.resume.cancel_jobs(active_jobs)
