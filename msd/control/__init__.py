"""Operating a running job: the authenticated connection to its Planner, and what the
commands (status, mix, rescale, ls, report) and the metrics endpoint make of it."""
