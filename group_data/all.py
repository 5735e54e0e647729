"""Settings for every host. Each key is documented in docs/configuration.md;
a host or a group file (group_data/<group>.py) can override any single key, and
`--data KEY=VALUE` overrides it for one run. Keys not set here take their documented default.
"""

# The engine: an exact SGLang release, and the CUDA build its torch and kernels come in.
# cu128 runs on the 570 driver branch (CUDA 12.8), the first that targets sm_120.
sglang_version = "0.5.11"
cuda_lane = "cu128"

# The model: served under model_name, read from model_source on the target (a Proxmox bind
# mount), staged into model_stage_dir (tmpfs) before the servers start.
model_name = "Qwen/Qwen3.6-27B"
model_source = "/mnt/models/Qwen3.6-27B"
