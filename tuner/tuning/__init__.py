"""The search: settings, search space, the Optuna study and its loop, one trial (`tuner.tuning.trial`), the
coordinator and its workers, and the conclusion (winner, held-out scores, export)."""
