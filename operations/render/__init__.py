"""Rendering: the text of what is written on a host (systemd units, ExecStart= words, the
bundled host programs, the Grafana dashboard), from the plan's values."""
