"""The model side of a step: the decoder, attention (PyTorch reference and Triton kernel), MoE, CUDA graphs
and their dispatch, speculative decoding and its drafter, the micro-batch gate, checkpoint loading.

May import: torch, triton, numpy, mixdiag.engine.config. Nothing outside the engine."""
