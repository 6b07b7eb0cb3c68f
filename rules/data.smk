# The shipped real data: scikit-learn's bundled handwritten digits (1,797 real 8x8
# scans, in the scikit-learn wheel: nothing is downloaded) written by dlscale.data.shipped into
# each dataset format, so the readers that read CIFAR-10 or ImageNet on a cluster read them here.
# One copy per format under results/data/, shared by every study (not under results/<study>/).
# Deterministic: rewriting gives the same bytes. A job that reads them takes
# `shipped_data(<format>)` as input: marked ancient, so a rewrite (e.g. after this file
# changes) never re-runs the cells that read them.
# (SHIPPED_DIGITS and shipped_data() live in dlscale.workflow.job_params, imported here for every
# rule file: snakemake --lint wants no functions beside rules.)
from dlscale.data import FORMATS as DATA_FORMATS
from dlscale.workflow.job_params import SHIPPED_DIGITS, shipped_data


rule shipped_digits:
    output:
        directory(f"{SHIPPED_DIGITS}/{{data_format}}"),
    log:
        f"results/data/logs/digits_{{data_format}}.log",
    wildcard_constraints:
        data_format="|".join(DATA_FORMATS),
    run:
        from dlscale.data.shipped import write_digits_checked

        write_digits_checked(output[0], wildcards.data_format, log[0])
