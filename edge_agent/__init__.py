"""The edge agent: describes its host, accepts placements, runs tasks, ships outputs."""

import os

# ONNX Runtime (1.29 on) uploads usage telemetry from Linux and keeps a device id and an
# offline event cache under ~/.cache/Microsoft: an agent must make no connection its operator
# did not ask for (nor the exec tasks it starts, which inherit this). Off unless the
# environment says otherwise; ONNX Runtime reads it when it is imported, after this.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
