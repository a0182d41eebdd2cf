"""The value model's mechanisms against Monte-Carlo ground truth: `value_bias` (the suite),
`value_bias_stats` (its estimators) and `cog_criteria` (the pre-registered verdicts); see
README.md."""
