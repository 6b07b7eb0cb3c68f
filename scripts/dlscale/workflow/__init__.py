"""The Snakemake glue: a cell's job step without Snakemake inside the allocation (`jobstep`),
resume after a lost driver (`resume`), the `dlscale status` command (`status_command`), the
parse-time check that each cell's environment can drive its device (`capability`) and the
partial report of a study that did not complete (`finalize`)."""
