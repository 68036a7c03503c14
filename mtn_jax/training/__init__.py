"""Training: the resumable loop and its jitted steps, orbax checkpoints of the whole run, and the
metric writer."""
