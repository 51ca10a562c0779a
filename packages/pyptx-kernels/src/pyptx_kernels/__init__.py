"""pyptx-kernels: the pyptx kernel library."""
