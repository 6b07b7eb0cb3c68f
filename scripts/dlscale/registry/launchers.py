"""The launchers: how a cell's ranks start (the config key `launcher`), one record each, read by
every part that differs between them (the matrix's executor check, the preflight, the container
check, the commands the tool prints). The code that starts the ranks is each launcher's class,
one file each, in dlscale.run.launchers (ReFrame keeps its job launchers the same way); a
container engine wraps the rank's command the same way under either launcher
(dlscale.registry.containers). The schema's `launcher` enum is filled from here.

Adding a launcher: a record here, its class in dlscale.run.launchers/<name>.py (registered with
`@register`), a profile under profiles/ whose executor runs its cells, and its line in
docs/pages/extending.md's launcher checklist. tests/unit/registry/test_registry.py checks that
record and class come in pairs and that no other module lists the names.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.registry.strategies import RegistryError


@dataclass(frozen=True)
class Launcher:
    """One launcher's facts.

    `slurm_step`: the ranks start as one Slurm job step inside the cell's allocation (the
    cells queue, so a preflight job runs before them; Slurm binds the ranks, so the preflight
    checks the binding; a container engine that is an srun plugin works only here).
    `executors`: the Snakemake executors whose jobs need this launcher (the matrix refuses
    another one under them; other executors, such as a site's own plugin, are not checked).
    `profile`: the shipped profile that runs its cells, for the commands the tool prints."""

    name: str
    description: str
    slurm_step: bool
    executors: tuple[str, ...]
    profile: str

    def __post_init__(self):
        for fact in ("name", "description", "profile"):
            if not getattr(self, fact):
                raise RegistryError(f"launcher record {self.name!r}: fact {fact!r} is empty")


LAUNCHERS = {
    record.name: record
    for record in (
        Launcher(
            "local",
            "nodes x ranks_per_node processes on this machine, one simulated node per group of "
            "ranks, rendezvous on loopback (the embedded default)",
            slurm_step=False,
            executors=("local",),
            profile="profiles/local",
        ),
        Launcher(
            "srun",
            "one srun step with every rank inside the cell's Slurm allocation",
            slurm_step=True,
            executors=("slurm", "dlscale"),
            profile="profiles/slurm",
        ),
    )
}
DEFAULT_LAUNCHER = "local"


def names() -> list[str]:
    return list(LAUNCHERS)


def launcher(name: str | None) -> Launcher:
    """The record of `name` (None: the default, a config without the key)."""
    name = DEFAULT_LAUNCHER if name is None else name
    if name not in LAUNCHERS:
        raise RegistryError(f"launcher {name!r}; allowed: {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]


def for_executor(executor: str | None) -> Launcher | None:
    """The launcher the Snakemake executor `executor` needs, or None where it needs none of
    them in particular."""
    return next((r for r in LAUNCHERS.values() if executor in r.executors), None)


def on_slurm(name: str | None) -> bool:
    """Whether launcher `name` starts its ranks as a Slurm job step."""
    return launcher(name).slurm_step
