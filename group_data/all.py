# No gateway or key here: both name one inventory's host and files; inventory/ct200.py sets them.
"""Settings for every host. Each key is documented in docs/reference/settings.md;
a host or a group file (group_data/<group>.py) can override any single key, and
`--data KEY=VALUE` overrides it for one run. Keys not set here take their documented default.

Why the gateway (router) and the API key are not set here: router.host must name a host of the
inventory in use and api_key_file a file on the controller, and every inventory reads this file
(the demo's simulated host, the tests' containers), which would then be refused. A real
inventory sets both: inventory/ct200.py puts smg on port 8000 in front of the ranks, with the key
in locks/api.key (`make api-key` makes it).
"""

# The engine: an exact SGLang release, and the CUDA build its torch and kernels come in.
# cu128 runs on the 570 driver branch (CUDA 12.8), the first that targets sm_120.
sglang_version = "0.5.11"
cuda_lane = "cu128"

# The model: served under model_name, read from model_source on the target (a Proxmox bind
# mount), staged into model_stage_dir (tmpfs) before the servers start.
model_name = "Qwen/Qwen3.6-27B"
model_source = "/mnt/models/Qwen3.6-27B"
