"""The `tune` command line: parsing and validation; the work is the packages below."""
