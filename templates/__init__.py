"""Recipe and job-script templates shipped with msd (read with importlib.resources)."""
