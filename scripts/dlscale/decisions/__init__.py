"""What to do with the numbers: verdicts against regression references (`regression_check`:
tables, the check and its CLI; `reference_verdicts`: one verdict per point and metric;
`reference_bless`: recording references), two studies side by side (`compare`) and the planner
that picks framework, strategy, partition and node count within a budget or deadline (`planner`:
the plan and its CLI; `plan_options`: jobs and the options that fit; `plan_program`: the
integer program; `plan_report`: the report's Recommendations)."""
