"""Reference mixed-batch inference engine (PyTorch + Triton), instrumented; the testbed."""
