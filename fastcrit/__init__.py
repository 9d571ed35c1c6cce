"""fastcrit: a kernel-optimised single-node trainer for critique and verifiable-reward RL."""

__version__ = "0.1.0"
