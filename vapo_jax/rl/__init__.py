"""One RL step as named parts: rollout → reward → advantages (the experience), then update."""
