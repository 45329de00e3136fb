"""The real executor: a small transformer that really prefills and decodes on a paged KV cache (numpy, or
torch on CPU or CUDA), and the calibration of the cost model against its measured steps.
"""
