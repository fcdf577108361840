"""Three edge application pipelines, with the constraints and data volumes real ones have.

Why: random DAGs and scientific workflows have no notion of "must run on the camera's side"
or "needs an accelerator"; these pipelines do, so they exercise tier and kind constraints and
the trade-off between a fast GPU far away and a slow CPU next to the data.

Units: `work` is seconds on one server core (speed 1.0; edge CPUs run at ~0.1-0.8 of it,
accelerators at 2-10x, see `tiered`); edge weights are bytes. Rationale for each number is in
the builder's docstring; they are order-of-magnitude figures, not measurements.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.scheduling.model import Task, TaskGraph

KB = 1e3
MB = 1e6

ACCELERATORS = frozenset({"gpu", "npu"})
NEAR_DATA = frozenset({"device", "edge"})
EDGE_OR_FOG = frozenset({"edge", "fog"})
CLOUD = frozenset({"cloud"})
ON_DEVICE = frozenset({"device"})
CPU = frozenset({"cpu"})
CPU_OR_GPU = frozenset({"cpu", "gpu"})


def video_analytics(streams: int = 4, *, seconds: float = 10.0) -> TaskGraph:
    """Per camera stream: decode -> detect -> track; all tracks fan in to one cloud aggregate.

    One planning window is `seconds` of 1080p30 H.264 video per stream.
    - decode (device or edge tier, cpu or gpu -- NVDEC): software H.264 1080p decode runs
      ~300 fps on a server core, so 0.1 s of work per second of video.
    - decode -> detect: the detector samples 5 fps resized to 640x640 RGB (1.23 MB a frame):
      ~6.1 MB per second of video, which is why decode and detect want to share a host.
    - detect (gpu/npu, >= 1 GB memory): a YOLO-nano-class model at ~100 ms a frame on a CPU
      core, so 0.5 s of work per second of video (an accelerator divides it by its speed).
    - detect -> track: up to 20 boxes a frame with 128-float re-ID embeddings (~536 B each),
      ~54 KB per second of video.
    - track (cpu, edge or fog tier): SORT-style association, ~5 ms a frame.
    - track -> aggregate: trajectory summaries, ~2 KB per second of video.
    - aggregate (cloud tier): counting/dashboard update, 50 ms plus 50 ms per stream.
    """
    if streams < 1 or not seconds > 0:
        raise ValueError("need streams >= 1 and seconds > 0")
    frames = 5.0 * seconds
    tasks: list[Task] = []
    edges: dict[tuple[str, str], float] = {}
    for s in range(streams):
        dec, det, trk = f"decode_{s}", f"detect_{s}", f"track_{s}"
        tasks += [
            Task(dec, work=0.1 * seconds, kinds=CPU_OR_GPU, tiers=NEAR_DATA),
            Task(det, work=0.1 * frames, kinds=ACCELERATORS, min_memory_mb=1024.0),
            Task(trk, work=0.005 * frames, kinds=CPU, tiers=EDGE_OR_FOG),
        ]
        edges[(dec, det)] = frames * 640 * 640 * 3
        edges[(det, trk)] = frames * 20 * (24 + 128 * 4)
        edges[(trk, "aggregate")] = 2 * KB * seconds
    tasks.append(Task("aggregate", work=0.05 + 0.05 * streams, tiers=CLOUD))
    return TaskGraph(tasks, edges)


def ar_offload(*, headset: str | None = None) -> TaskGraph:
    """One augmented-reality frame: capture -> features -> pose -> render -> display.

    Capture and display run on the user's device tier (pinned to `headset`, a device or agent
    id, when given); pose and render need a GPU, which the headset usually lacks, hence the
    offload. Budget: one frame at 30-60 Hz, so everything here is tens of milliseconds.
    - capture (device): sensor readout + hardware JPEG, 2 ms; a 720p JPEG is ~100 KB.
    - features (cpu or gpu, device or edge): ORB-style 1,000 keypoints on 720p, ~20 ms on a
      core; 40 B per keypoint (32 B descriptor + coordinates) = 40 KB.
    - pose (gpu, >= 512 MB): tracking against the map, ~30 ms on a core; a 4x4 float pose.
    - render (gpu, >= 1 GB): the virtual overlay, ~100 ms of CPU-equivalent work; encoded as a
      720p intra frame, ~80 KB.
    - display (device): decode + composite over the camera frame, 3 ms; it also takes the raw
      camera frame from capture (1280x720 YUV420, 1.38 MB) -- free only on the same device.
    """
    tasks = [
        Task("capture", work=0.002, tiers=ON_DEVICE, pinned=headset),
        Task("features", work=0.02, kinds=CPU_OR_GPU, tiers=NEAR_DATA),
        Task("pose", work=0.03, kinds=frozenset({"gpu"}), min_memory_mb=512.0),
        Task("render", work=0.1, kinds=frozenset({"gpu"}), min_memory_mb=1024.0),
        Task("display", work=0.003, tiers=ON_DEVICE, pinned=headset),
    ]
    edges = {
        ("capture", "features"): 100 * KB,
        ("features", "pose"): 1000 * 40.0,
        ("pose", "render"): 64.0,
        ("render", "display"): 80 * KB,
        ("capture", "display"): 1280 * 720 * 1.5,
    }
    return TaskGraph(tasks, edges)


def sensor_fusion(sensors: int = 8) -> TaskGraph:
    """One second of readings: read -> filter per sensor, fuse, anomaly model, cloud archive.

    - read (device tier): an IMU-class sensor at 100 Hz x 6 channels x 4 B = 2.4 KB/s; 1 ms.
    - filter (cpu, device or edge): FIR/Kalman smoothing of 600 samples, 2 ms; same size out.
    - fuse (cpu, edge or fog): an EKF update over all sensors, 5 ms per sensor; a 100-step window
      of a 16-float state = 6.4 KB, to the model and to the archive.
    - anomaly (cpu or npu, edge or fog): a small autoencoder over the window, 50 ms; a 64 B score.
    - archive (cloud): append window and score to storage, 10 ms.
    """
    if sensors < 1:
        raise ValueError("need sensors >= 1")
    reading = 100 * 6 * 4.0
    window = 100 * 16 * 4.0
    tasks: list[Task] = []
    edges: dict[tuple[str, str], float] = {}
    for s in range(sensors):
        tasks += [
            Task(f"read_{s}", work=0.001, tiers=ON_DEVICE),
            Task(f"filter_{s}", work=0.002, kinds=CPU, tiers=NEAR_DATA),
        ]
        edges[(f"read_{s}", f"filter_{s}")] = reading
        edges[(f"filter_{s}", "fuse")] = reading
    tasks += [
        Task("fuse", work=0.005 * sensors, kinds=CPU, tiers=EDGE_OR_FOG),
        Task("anomaly", work=0.05, kinds=frozenset({"cpu", "npu"}), tiers=EDGE_OR_FOG),
        Task("archive", work=0.01, tiers=CLOUD),
    ]
    edges[("fuse", "anomaly")] = window
    edges[("fuse", "archive")] = window
    edges[("anomaly", "archive")] = 64.0
    return TaskGraph(tasks, edges)


PIPELINES: dict[str, Callable[[], TaskGraph]] = {
    "video_analytics": video_analytics,
    "ar_offload": ar_offload,
    "sensor_fusion": sensor_fusion,
}
"""Each pipeline with its default parameters, by name (for benchmarks and the CLI)."""
