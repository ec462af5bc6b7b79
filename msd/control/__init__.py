"""Operating a running job: the authenticated connection to its Planner, and what the
commands (status, report, the SLURM queue) and the metrics endpoint make of it. The job folder's
records (mix history, rescales, shadows, runs) are ``msd.jobdir``'s."""
