"""Kernel support shared by client and worker: argument packing and built-in kernels."""
