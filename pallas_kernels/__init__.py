"""Pallas kernels (MXFP8 / NVFP4 MoE matmuls, attention), one package per op: kernel.py, ops.py, reference.py."""
