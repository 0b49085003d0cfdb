"""Small utilities every layer may use: default places and the one atomic writer, safe YAML, values shown
shortened in errors, temporary folders that name their owner. Nothing here imports the rest of posfair."""
