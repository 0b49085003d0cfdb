"""The search: settings, search space, one trial's objective, the Optuna study and its loop, the coordinator
and its workers, and the conclusion (winner, held-out scores, export)."""
