"""TEST DOUBLE of cuda-python's `cuda.bindings` (the package the cuda-python wheels bring): only
`driver`, the CUDA driver API the engine check uses."""
