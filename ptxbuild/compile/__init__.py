"""The compile stage: CUDA C++ -> PTX -> cubin with the NVRTC/nvJitLink wheels."""
