"""Learning-rate scaling rules (dlscale.study.lr): none, linear with warm-up (Goyal et al. 2017),
sqrt."""

from __future__ import annotations

import math

import pytest

from dlscale.study.lr import RULES, Schedule, scaled_lr


@pytest.mark.parametrize(
    "rule, global_batch, expected",
    [
        ("none", 64, 0.1),
        ("linear", 64, 0.4),  # 0.1 x 64 / 16
        ("linear", 8, 0.05),  # smaller than the reference: scaled down
        ("sqrt", 64, 0.2),  # 0.1 x sqrt(4)
        ("sqrt", 16, 0.1),  # at the reference every rule gives the base rate
        ("linear", 16, 0.1),
    ],
)
def test_scaled_learning_rate(rule, global_batch, expected):
    assert scaled_lr(rule, 0.1, global_batch, 16) == pytest.approx(expected)


def test_rules_are_exactly_three():
    assert RULES == ("none", "linear", "sqrt")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("cubic", 0.1, 16, 16), "allowed values: none, linear, sqrt"),
        (("linear", 0.0, 16, 16), "must be > 0"),
        (("linear", 0.1, 0, 16), ">= 1"),
        (("linear", 0.1, 16, 0), ">= 1"),
    ],
)
def test_bad_arguments_are_refused_by_name(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        scaled_lr(*args)


def test_linear_warmup_ramps_from_base_to_scaled_step_by_step():
    s = Schedule(
        rule="linear",
        base=0.1,
        reference_batch=16,
        global_batch=64,
        warmup_epochs=2,
        steps_per_epoch=5,
    )
    assert s.scaled == pytest.approx(0.4) and s.warmup_steps == 10
    rates = [s.at(t) for t in range(12)]
    assert rates[0] == pytest.approx(0.1)  # the base rate at the first step
    assert rates[5] == pytest.approx(0.1 + 0.3 * 5 / 10)  # halfway through warm-up
    assert all(b > a for a, b in zip(rates[:10], rates[1:11]))  # strictly rising
    assert rates[10] == rates[11] == pytest.approx(0.4)  # then the scaled rate, constant
    assert "linear warm-up from 0.1 over 2 epoch(s) (10 steps)" in s.describe()


def test_no_warmup_and_rule_none_give_constant_rates():
    flat = Schedule("sqrt", 0.1, 16, 64, warmup_epochs=0, steps_per_epoch=7)
    assert all(flat.at(t) == pytest.approx(0.2) for t in range(20))
    none = Schedule("none", 0.1, 16, 64, warmup_epochs=3, steps_per_epoch=7)
    assert all(none.at(t) == pytest.approx(0.1) for t in range(30))
    assert "warm-up" not in none.describe()


def test_fractional_warmup_epochs_round_to_steps():
    s = Schedule("linear", 0.05, 32, 64, warmup_epochs=0.5, steps_per_epoch=9)
    assert s.warmup_steps == 4 and s.at(4) == pytest.approx(0.1)
    assert s.at(2) == pytest.approx(0.05 + 0.05 * 2 / 4)


def test_schedule_refuses_negative_warmup_and_step():
    with pytest.raises(ValueError, match="warmup_epochs"):
        Schedule("linear", 0.1, 16, 16, warmup_epochs=-1, steps_per_epoch=5)
    s = Schedule("linear", 0.1, 16, 16, warmup_epochs=0, steps_per_epoch=5)
    with pytest.raises(ValueError, match="step -1"):
        s.at(-1)
    assert math.isclose(s.scaled, 0.1)
