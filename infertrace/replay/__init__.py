"""What-if replay of a captured window: the traffic a model's engines served, read back from the store
(`capture.py`), the deployment it ran on and the variants to try (`deployment.py`), and the comparison of
replays with the capture and with each other (`compare.py`).

The toolkit never runs the engine itself: `infertrace replay` (infertrace/cli/replay.py) hands the
reconstructed requests and each deployment to `reference_engine.api.replay` and renders what comes back.
"""
