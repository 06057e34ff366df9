"""Run models on the CPU and judge a candidate's outputs against the original's."""
