"""The documentation's figures as code: each module turns some benchmarks' JSON records into Markdown or a plot."""
