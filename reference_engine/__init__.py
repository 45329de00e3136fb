"""The bundled inference engine: the data source of every scenario, bank and benchmark, and a reference for how
to instrument an engine. `engine/` is the engine itself (read it like nano-vllm), `compute/` the real executor,
`telemetry/` what it emits, `fleet/` the gateway and the models behind it, `scenarios/` the incidents with their
ground truth; `api.py` is the toolkit's one door in.
"""
