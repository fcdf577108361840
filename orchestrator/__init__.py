"""The cloud orchestrator: receives pipelines, plans and books them, watches them run."""

import os

# ONNX Runtime (1.29 on) uploads usage telemetry from Linux and keeps a device id and an
# offline event cache under ~/.cache/Microsoft: an orchestrator must make no connection its
# operator did not ask for. Off unless the environment says otherwise (edge_agent does the
# same); ONNX Runtime reads it when it is imported, which our modules do after this.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
