"""The Snakemake glue: a cell's job step without Snakemake inside the allocation (`jobstep`),
resume after a lost driver (`resume`; its journal, driver record and
locks in `resume_journal`), the `dlscale status` command (`status_command`), the
parse-time check that each cell's environment can drive its device (`capability`), every output
path of a study (`paths`), the partial report of a study that did not complete, built by the
workflow's own rules (`finalize`), and what rules/common.smk and the Snakefile call: the
parse-time checks (`guards`), the driver's onstart/onsuccess/onerror hooks (`lifecycle`), the
train jobs' params and inputs (`job_params`) and the study's figure files (`figure_files`)."""
