"""The Snakemake glue: a cell's job step without Snakemake inside the allocation (`jobstep`),
resume after a lost driver (`resume`; its journal, driver record and
locks in `resume_journal`), the `dlscale status` command (`status_command`), the
parse-time check that each cell's environment can drive its device (`capability`), every output
path of a study (`paths`) and the partial report of a study that did not complete, built by the
workflow's own rules (`finalize`)."""
