"""One trial: what Optuna's objective does with a drawn config, from the draw to its records.

`objective` (`TrialObjective`, the trial's steps in order) draws the config and asks `repeats` whether the study
ran it already; `cost` reserves what it may spend; `scoring` scores it rung by rung (the pooled screen, the tuning
passages, the other structures) and prunes between rungs, judging drift by `drift_yardstick`; `profile` measures a
complete trial's attention profile; `record` writes its outcome to Optuna and to its MLflow run. What runs the
study around the trials (its loop, the winner, the export) is the rest of `tuner.tuning`.
"""
