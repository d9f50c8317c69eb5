"""Training: losses, advantages, the trajectory buffer, learners, rollout workers, the loop."""
