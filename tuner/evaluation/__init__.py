"""One config on one dataset: run the passes, search, score by position; what is kept between trials
(cache policy and its checked store), attention profiles, and what a pass costs."""
