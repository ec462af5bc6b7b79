"""Checkpoints of the Planner's state: small, differential, atomic, never pickled.

A job's stream is a pure function of (recipe, seed, mix history), so all it takes to continue
it exactly is the Planner's state at a step every rank has consumed: the step, each source's
cursor, and the samples drawn but not yet placed (``msd.plan.step.PlannerState``).

    JOB/checkpoints/step-00000100.json   a snapshot: the state at step 100, the recipe, the
                                         mix history, totals; sha256 of its body inside
    JOB/checkpoints/log-00000100.jsonl   one line per step consumed after it: the cursors
                                         that moved and the carry, with a CRC each

``format``: the two file formats; ``store``: writing them and finding the state at a step;
``validate``: every field typed and in range, the embedded recipe checked as a recipe file;
``signing``: snapshots signed with the job's key (what ``msd restore`` may trust);
``compat``: whether a checkpoint may continue under another recipe.
"""
