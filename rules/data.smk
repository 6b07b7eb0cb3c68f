# The shipped real data (issue 15): scikit-learn's bundled handwritten digits (1,797 real 8x8
# scans, in the scikit-learn wheel: nothing is downloaded) written by dlscale.data.shipped into
# each dataset format, so the readers that read CIFAR-10 or ImageNet on a cluster read them here.
# One copy per format under results/data/, shared by every study (not under results/<study>/).
# Deterministic: rewriting gives the same bytes. A job that reads them takes
# `shipped_data(<format>)` as input: marked ancient, so a rewrite (e.g. after this file
# changes) never re-runs the cells that read them.
from dlscale.data import FORMATS

SHIPPED_DIGITS = "results/data/digits"


def shipped_data(data_format):
    """The shipped digits in `data_format` (one of dlscale.data.FORMATS) as a job's input."""
    if data_format not in FORMATS:
        raise WorkflowError(
            f"dlscale: no shipped data in format {data_format!r}; allowed: {', '.join(FORMATS)}"
        )
    return ancient(f"{SHIPPED_DIGITS}/{data_format}")


rule shipped_digits:
    output:
        directory(f"{SHIPPED_DIGITS}/{{data_format}}"),
    log:
        f"results/data/logs/digits_{{data_format}}.log",
    wildcard_constraints:
        data_format="|".join(FORMATS),
    run:
        from dlscale.data import inspect_dataset
        from dlscale.data.shipped import write_digits

        write_digits(output[0], wildcards.data_format)
        info = inspect_dataset(output[0], wildcards.data_format)
        with open(log[0], "w") as fh:
            print(f"wrote {info}", file=fh)
