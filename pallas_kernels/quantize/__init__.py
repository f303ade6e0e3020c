"""MXFP8 and NVFP4 quantizers: `ops` (public API), `kernel` (Pallas), `reference` (pure jnp), `hadamard`."""
