"""What to do with the numbers: verdicts against regression references (`regression_check`),
two studies side by side (`compare`) and the planner that picks framework, partition and node
count within a budget or deadline (`planner`)."""
