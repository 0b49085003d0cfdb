"""`tune evaluate`: the paper's Table 1 and Table 3 for given configs, with its baselines (Segment Embed Average);
`tune diagnose`: a model's uncalibrated position bias on a dataset, and whether calibration is indicated."""
