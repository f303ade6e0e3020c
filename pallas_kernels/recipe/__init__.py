"""The NVFP4-forward / MXFP8-backward expert matmul recipe as one differentiable op (ops.py)."""
