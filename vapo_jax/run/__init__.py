"""Running a training job: the trainer's stages, checkpoints, run control, metrics, plots."""
