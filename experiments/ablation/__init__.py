"""The ablation table: `ablate` (the runner), `ablation_report` (its table and plot) and
`sft_band` (the check of a shared SFT start); see README.md."""
