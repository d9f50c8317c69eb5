"""Reward functions usable inside and outside environments."""
