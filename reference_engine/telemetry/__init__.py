"""What the engine emits: the tracer (what happened in a step → spans) and the OTLP encoding and sinks.
"""
