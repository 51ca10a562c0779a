"""Row kernels (RMSNorm, LayerNorm, softmax, SwiGLU): per-shape builders in the modules
``rms_norm``, ``layer_norm``, ``softmax`` and ``swiglu``; the public functions of the same
names are in ``api`` (not re-exported here: they would shadow those modules)."""
