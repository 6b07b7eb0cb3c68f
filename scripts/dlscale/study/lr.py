"""Learning-rate scaling rules: the learning rate a cell trains with, from its global batch.

A study states a base learning rate `base` tuned at a reference global batch `reference`; a
cell with global batch B trains at the *scaled* learning rate

    none    lr = base                                 (the same rate at every batch)
    linear  lr = base x B / reference                 (Goyal et al. 2017, "Accurate, Large
                                                       Minibatch SGD", linear scaling rule)
    sqrt    lr = base x sqrt(B / reference)           (Krizhevsky 2014; Hoffer et al. 2017)

and reaches it by a linear warm-up over `warmup_epochs` epochs (Goyal et al.'s gradual
warm-up): at optimizer step t of T = warmup_epochs x steps_per_epoch warm-up steps the rate is
base + (scaled - base) x t / T, then the scaled rate for the rest of training. Under `none`
the two ends are equal, so warm-up changes nothing. No decay follows: the convergence cells
stop at their target accuracy or epoch cap.

Pure Python, no framework: imported by the ranks (every framework environment) and by the
analysis side (the report states the rule and the rates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RULES = ("none", "linear", "sqrt")

RULE_FORMULAS = {
    "none": "lr = base",
    "linear": "lr = base x global_batch / reference_batch",
    "sqrt": "lr = base x sqrt(global_batch / reference_batch)",
}


def check_rule(rule: str) -> None:
    if rule not in RULES:
        raise ValueError(f"lr_rule: {rule!r} is not a rule; allowed values: {', '.join(RULES)}")


def scaled_lr(rule: str, base: float, global_batch: int, reference_batch: int) -> float:
    """The learning rate a cell of `global_batch` trains at after warm-up."""
    check_rule(rule)
    if base <= 0 or global_batch < 1 or reference_batch < 1:
        raise ValueError(
            f"base learning rate {base} must be > 0, global batch {global_batch} and "
            f"reference batch {reference_batch} >= 1"
        )
    ratio = global_batch / reference_batch
    return base * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


@dataclass(frozen=True)
class Schedule:
    """The learning rate of every optimizer step of a convergence cell."""

    rule: str
    base: float
    reference_batch: int
    global_batch: int
    warmup_epochs: float
    steps_per_epoch: int

    def __post_init__(self):
        check_rule(self.rule)
        if self.warmup_epochs < 0 or self.steps_per_epoch < 1:
            raise ValueError(
                f"warmup_epochs {self.warmup_epochs} must be >= 0 and steps_per_epoch "
                f"{self.steps_per_epoch} >= 1"
            )

    @property
    def scaled(self) -> float:
        """The rate after warm-up (`scaled_lr`): the cell's effective learning rate."""
        return scaled_lr(self.rule, self.base, self.global_batch, self.reference_batch)

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup_epochs * self.steps_per_epoch)

    def at(self, step: int) -> float:
        """The rate of optimizer step `step` (0-based, counted over the whole training)."""
        if step < 0:
            raise ValueError(f"step {step} must be >= 0")
        scaled, warm = self.scaled, self.warmup_steps
        if step >= warm:
            return scaled
        return self.base + (scaled - self.base) * step / warm

    def describe(self) -> str:
        """One sentence for the metrics and the report."""
        warm = (
            f", reached by a linear warm-up from {self.base:g} over {self.warmup_epochs:g} "
            f"epoch(s) ({self.warmup_steps} steps)"
            if self.warmup_steps and self.scaled != self.base
            else ""
        )
        return (
            f"{self.rule}: {RULE_FORMULAS[self.rule]} = {self.scaled:.6g} (base {self.base:g}, "
            f"reference batch {self.reference_batch}, global batch {self.global_batch}){warm}"
        )
