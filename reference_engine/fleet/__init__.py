"""A fleet on one virtual clock: models and their engine replicas behind shared gateway components (auth, rate
limiter, router, global queue), prefill/decode disaggregation over links, tenants and their traffic.
"""
