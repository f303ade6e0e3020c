"""Grouped matmuls for MoE experts (forward, d_lhs, d_rhs): kernel.py (Pallas), ops.py (public), reference.py."""
