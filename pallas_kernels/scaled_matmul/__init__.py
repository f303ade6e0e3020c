"""Block-scaled (MXFP8 / NVFP4) dense matmul: kernel.py (Pallas), ops.py (public), reference.py (jnp)."""
