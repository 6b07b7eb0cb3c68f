"""The parse-time door of a study's own models (config `models:`; docs/pages/your-model.md), as
the model's environment runs it, in a bounded subprocess started by dlscale.study.study_models:

- `python -m dlscale.models.zoo_probe probe` reads one request (JSON) on standard input and
  prints the model's facts, or the error, as one line starting with PROBE_PREFIX. An entry
  point is looked up and its builder imported first, before torch starts here: a missing entry
  point (the installed ones named) or a builder that cannot be imported is refused in a
  fraction of a second. Then dlscale.models.torch.zoo builds the model on the meta device and
  measures it (`facts`).
- `python -m dlscale.models.zoo_probe entry-points` prints the entry points of the
  `dlscale.models` group installed in the environment (`dlscale models list`), from the
  packages' metadata alone: nothing is imported.

No torch at import: torch and transformers start only for `probe`'s facts.
"""

from __future__ import annotations

import json
import os
import re
import sys

from dlscale.models.entry_points import find_entry_point, installed_entry_points, load_builder
from dlscale.registry.model_sources import ENTRY_POINT

PROBE_PREFIX = "DLSCALE-MODEL-FACTS "  # the line of the answer
# nothing from the hub, ever: set before anything imports transformers (it reads them at
# import), a user's package included
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def probe(request: dict) -> dict:
    """{"facts": ...} of the request's model, or {"error": ...} naming what failed."""
    try:
        record = request["record"]
        if record["source"] == ENTRY_POINT:
            load_builder(find_entry_point(record["definition"]["entry_point"]))
        from dlscale.models.torch import zoo

        return {"facts": zoo.facts(request)}
    except Exception as exc:  # noqa: BLE001 - reported to the study's parse, named
        message = re.sub(r"\s+", " ", f"{type(exc).__name__}: {exc}").strip()
        return {"error": message[:2000]}


def main(argv: list[str]) -> int:
    for variable in OFFLINE:
        os.environ[variable] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if argv == ["entry-points"]:
        listing = {"entry_points": installed_entry_points(), "python": sys.prefix}
        print(PROBE_PREFIX + json.dumps(listing))
        return 0
    if argv != ["probe"]:
        print(__doc__, file=sys.stderr)
        return 2
    result = probe(json.loads(sys.stdin.read()))
    print(PROBE_PREFIX + json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
