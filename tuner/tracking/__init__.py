"""What a study leaves for people to read: MLflow runs and tags, the registered model, plots, progress lines."""
