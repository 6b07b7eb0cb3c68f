"""A transformers model defined in a study (config `models:`) trains under every strategy it may
run as one process does: a 2-layer LlamaConfig, checked in its environment (pytorch-hf) when
the study is parsed, then real ranks of the production PyTorch adapter (2 processes, gloo) under
ddp, fsdp, hsdp, tp (transformers' own plan) and fsdp+tp, 3 steps of plain SGD each, against the
single-process program on the same global batch. Plain SGD shows a wrong gradient scale: the
loss a missed data-parallel average trains to is computed too, and the tolerance is under a
tenth of its effect. Its parameters are the library's count; sharding halves them per rank."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlscale.models import zoo
from dlscale.study.matrix import load_workflow_study
from dlscale.study.study_models import environment_python

from helpers.checkout import ROOT

ENV = environment_python("pytorch-hf", ROOT)
ZOO_RANKS = ROOT / "tests" / "helpers" / "zoo_ranks.py"
STRATEGIES = ["ddp", "fsdp", "hsdp", "tp", "fsdp+tp"]
TOLERANCE = 1e-4  # relative, the target
# the worked example of docs/pages/your-model.md (its first block), parsed as a study here
EXAMPLE = """\
study: my_models
models:
  llama_2l:
    transformers:
      config_class: LlamaConfig
      config: {num_hidden_layers: 2, hidden_size: 64, intermediate_size: 128,
               num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 1024}
    seq_len: 16
axes:
  framework: [pytorch]
  model: [llama_2l]
  hardware: [cpu]
  nodes: [1]
  policy: [weak]
  precision: [fp32]
  mode: [eager]
  parallelism: [ddp, fsdp, tp]
ranks_per_node: 2
"""

pytestmark = pytest.mark.skipif(
    not ENV.exists(), reason="no pytorch-hf environment: bash scripts/setup.sh pytorch-hf"
)


def example_study(folder):
    """The example as the documented command reads it: a study file over config/config.yaml."""
    (folder / "my-models.yaml").write_text(EXAMPLE)
    return load_workflow_study({"study_file": str(folder / "my-models.yaml")}, ROOT)


def test_the_documented_example_parses_as_printed(tmp_path):
    """docs/pages/your-model.md's example: the study's text is the page's, and what
    `python -m dlscale.workflow.models_command show` prints for it is the page's output block."""
    page = (ROOT / "docs" / "pages" / "your-model.md").read_text()
    assert EXAMPLE in page
    study = example_study(tmp_path)
    try:
        from dlscale.study.study_models import show

        printed = show(study)
    finally:
        zoo.unregister_all()
    assert f"```text\n{printed}```" in page, printed


def test_every_strategy_trains_as_one_process(tmp_path):
    study = example_study(tmp_path)
    cell = next(c for c in study.cells if c.model == "llama_2l")
    record = json.loads(cell.model_source)
    zoo.unregister_all()
    facts = record["facts"]
    assert facts["param_count"] == facts["library_param_count"] == 205_120
    (tmp_path / "record.json").write_text(cell.model_source)
    from dlscale.run.launchers.ports import local_port

    ports: list[int] = []  # production's chooser, one port per entry, each drawn once
    while len(ports) < len(STRATEGIES):
        port = local_port(2)
        ports += [] if port in ports else [port]
    # rank 1 computes the single-process reference (and what a missed average trains to)
    # after its entries, in its own interpreter: no third start of torch and transformers
    out = tmp_path / "reference.json"
    ranks = [
        subprocess.Popen(
            [
                str(ENV),
                str(ZOO_RANKS),
                str(tmp_path / "record.json"),
                "llama_2l",
                "rank",
                str(rank),
                "2",
                "2",
                ",".join(map(str, ports)),
                ",".join(STRATEGIES),
                "2",
                str(tmp_path / f"rank{rank}.json"),
                *([str(out), "no_average"] if rank == 1 else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in ranks:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    losses = json.loads(out.read_text())
    references = {None: losses["loss"], "no_average": losses["no_average"]}
    reference = references[None]
    effect = abs(references["no_average"] - reference) / reference
    assert TOLERANCE <= effect / 10, (effect, "a missed average must move the loss")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for strategy in STRATEGIES:
        for result in results:
            loss = result[strategy]["loss"]
            assert abs(loss - reference) / reference <= TOLERANCE, (strategy, loss, reference)
    full = results[0]["ddp"]["memory"]["param_bytes"]
    assert full == 205_120 * 4
    assert results[0]["fsdp"]["memory"]["param_bytes"] == full // 2
    # tensor parallel by transformers' plan: every Linear and the embedding halved, the norms
    # whole
    assert results[0]["tp"]["memory"]["param_bytes"] < 0.51 * full
    assert "model.embed_tokens" in results[0]["tp"]["execution"]["tensor_parallel"]
    print(f"zoo llama_2l: reference {reference:.7f}, no-average {references['no_average']:.7f}")
    print({s: [r[s]["loss"] for r in results] for s in STRATEGIES}, file=sys.stderr)
