"""The engine, read like nano-vllm: sequences, the block manager, the scheduler, the executor seam with the
roofline cost model, and `LLMEngine.step()`. It imports nothing from the rest of `reference_engine`.
"""
