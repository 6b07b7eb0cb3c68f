"""PyTorch's default initialisation schemes expressed as MXNet initializers."""

from __future__ import annotations

import math

import mxnet as mx
from mxnet.gluon import nn

__all__ = ["KAIMING_FAN_OUT", "XAVIER_UNIFORM", "linear"]

#: ``nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")``: N(0, sqrt(2 / fan_out)).
KAIMING_FAN_OUT = mx.init.MSRAPrelu(factor_type="out", slope=0.0)
#: ``nn.init.xavier_uniform_``: U(+-sqrt(6 / (fan_in + fan_out))).
XAVIER_UNIFORM = mx.init.Xavier(rnd_type="uniform", factor_type="avg", magnitude=3)


def linear(
    units: int,
    in_units: int,
    *,
    flatten: bool = True,
    zero_bias: bool = False,
    weight_initializer=None,
    prefix: str | None = None,
) -> nn.Dense:
    """A biased Dense layer with ``torch.nn.Linear``'s default initialisation:
    weight and bias U(+-1/sqrt(fan_in)) (kaiming_uniform with a=sqrt(5)); ``zero_bias`` for the
    layers PyTorch resets to zero bias (the attention projections)."""
    bound = 1.0 / math.sqrt(in_units)
    return nn.Dense(
        units,
        in_units=in_units,
        flatten=flatten,
        use_bias=True,
        weight_initializer=weight_initializer or mx.init.Uniform(bound),
        bias_initializer="zeros" if zero_bias else mx.init.Uniform(bound),
        prefix=prefix,
    )
