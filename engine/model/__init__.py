"""The model side of a step: the decoder, attention (PyTorch reference and Triton kernel), MoE, CUDA graphs
and their dispatch, speculative decoding and its drafter, the micro-batch gate, checkpoint loading.

May import: torch, triton, numpy, the base layer (mixdiag.wire, mixdiag.errors), mixdiag.engine.config
and mixdiag.engine.hooks. Never mixdiag.engine.core (the loop imports the model, not the other way)
and nothing else outside the engine."""
