"""The resolver: (settings, host facts) -> what each rank runs, or why it cannot.

This is the one place where flags, the attention backend and the CUDA lane are decided. It is a
pure function: tests feed it facts directly, the plan command and deploy.py feed it facts
gathered by pyinfra, and so what the plan shows is exactly what a deploy writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from operations import kb as kbmod
from operations.facts.gpu import NvidiaSmi
from operations.facts.host import Model
from operations.kb import Knowledge, in_range, version
from operations.settings import Settings

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
CONFIG_DIR = "/etc/sglang"
SECRETS_FILE = f"{CONFIG_DIR}/secrets.yaml"
STAGE_UNIT = "sglang-stage-model.service"  # operations/model.py: stages the weights at boot
START_TIMEOUT_S = 1800

# Options the resolver writes from settings; extra_server_args may not set them again.
MANAGED_OPTIONS = {
    "--model-path": "model_source",
    "--model": "model_source",
    "--served-model-name": "model_name",
    "--host": "server_host",
    "--port": "base_port",
    "--attention-backend": "attention_backend",
    "--mem-fraction-static": "mem_fraction_static",
    "--mamba-scheduler-strategy": "mamba_cache_strategy",
    "--mamba-radix-cache-strategy": "mamba_cache_strategy",
    "--cuda-graph-max-bs": "cuda_graph_max_bs",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs",
    "--speculative-algorithm": "speculative",
    "--speculative-num-steps": "speculative",
    "--speculative-eagle-topk": "speculative",
    "--speculative-num-draft-tokens": "speculative",
    "--enable-metrics": "enable_metrics",
    "--api-key": "api_key_file",
    "--config": "api_key_file",
    "--dp-size": "dp_size",
    "--data-parallel-size": "dp_size",
    "--tp-size": "dp_size",
    "--tensor-parallel-size": "dp_size",
    "--base-gpu-id": "dp_size",
}


@dataclass(frozen=True)
class Facts:
    """What the resolver knows of the host; None means not gathered (plan from settings)."""

    gpu: NvidiaSmi | None = None
    model: Model | None = None


@dataclass(frozen=True)
class Decision:
    what: str
    value: str
    why: str


@dataclass(frozen=True)
class Rank:
    rank: int
    gpu: int
    port: int
    argv: list[str]
    env: dict[str, str]
    unit_name: str
    unit: str


@dataclass
class HostPlan:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    ranks: list[Rank] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "errors": self.errors,
            "warnings": self.warnings,
            "decisions": [d.__dict__ for d in self.decisions],
            "ranks": [
                {"rank": r.rank, "argv": r.argv, "env": r.env, "unit": r.unit} for r in self.ranks
            ],
        }


def staged_model_path(settings: Settings) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", settings.model_name)
    return f"{settings.model_stage_dir}/models/{slug}"


def unit_name(rank: int) -> str:
    return f"sglang@{rank}.service"


def systemd_quote(arg: str) -> str:
    """Quote one ExecStart word so systemd passes it through unchanged."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and re.fullmatch(r"[A-Za-z0-9_./:=,+@-]+", escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _src(kb: Knowledge, entry: dict[str, Any]) -> str:
    return f"source: {kb.cite(entry['source'])}"


class _Resolution:
    """One host's resolution: collects errors instead of stopping at the first."""

    def __init__(self, settings: Settings, facts: Facts, kb: Knowledge) -> None:
        self.s = settings
        self.facts = facts
        self.kb = kb
        self.plan = HostPlan()
        self.release_known = settings.sglang_version in kb.releases
        self.table = kb.cli_table("sglang", settings.sglang_version)

    def error(self, message: str) -> None:
        self.plan.errors.append(message)

    def where(self, key: str) -> str:
        return f"(set in {self.s.origin(key)})"

    # -- engine release and CUDA lane --------------------------------------------------------

    def check_release(self) -> None:
        if self.release_known and self.table is not None:
            return
        release = self.s.sglang_version
        supported = ", ".join(self.kb.supported_releases())
        self.error(
            f"sglang_version {release!r} {self.where('sglang_version')} is not in the knowledge "
            f"base (supported: {supported}); to add it, run "
            f"'python scripts/gen_cli_table.py sglang {release}' and add a 'releases' entry in "
            "operations/knowledge/sglang.yaml (see operations/knowledge/cli/README.md)"
        )

    def driver(self) -> str | None:
        gpu = self.facts.gpu
        return gpu.driver_version if gpu is not None and gpu.ok else None

    def driver_runs(self, lane: dict[str, Any]) -> bool | None:
        driver = self.driver()
        if driver is None or "," in driver:
            return None
        return version(driver) >= version(lane["min_driver"])

    def check_lane(self) -> None:
        s, kb = self.s, self.kb
        lane = kb.lanes.get(s.cuda_lane)
        if lane is None:
            self.error(
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')} is not a known lane; "
                f"accepted: {', '.join(kb.lanes)}"
            )
            return
        release = s.sglang_version
        if not in_range(release, lane["releases"]):
            offered = kb.lanes_for_release(release)
            message = (
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')}: sglang {release} has no "
                f"{s.cuda_lane} (CUDA {lane['cuda']}) lane; {s.cuda_lane} is published for "
                f"sglang {lane['releases']}; sglang {release} offers "
                f"{', '.join(offered) or 'no known lane'}"
            )
            runnable = [name for name in offered if self.driver_runs(kb.lanes[name]) is not False]
            if offered and not runnable:
                needs = ", ".join(
                    f"{n} needs driver >= {kb.lanes[n]['min_driver']}" for n in offered
                )
                message += (
                    f", and this host's driver {self.driver()} cannot run them ({needs}): "
                    f"pin a release that has a {s.cuda_lane} lane or upgrade the host driver"
                )
            self.error(f"{message} ({_src(kb, lane)})")
            return
        self.plan.decisions.append(
            Decision("CUDA lane", s.cuda_lane, f"CUDA {lane['cuda']} build of torch and kernels")
        )
        if self.driver_runs(lane) is False:
            self.error(
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')}: the host's driver "
                f"{self.driver()} cannot run CUDA {lane['cuda']} (needs driver >= "
                f"{lane['min_driver']}) ({_src(kb, lane)})"
            )
        gpu = self.facts.gpu
        banner_cuda = gpu.cuda_version if gpu is not None and gpu.ok else None
        if banner_cuda is not None and version(banner_cuda) < version(lane["cuda"]):
            self.error(
                f"cuda_lane {s.cuda_lane!r} {self.where('cuda_lane')}: nvidia-smi reports "
                f"CUDA Version {banner_cuda}, below the lane's CUDA {lane['cuda']} "
                f"({_src(kb, lane)})"
            )

    # -- GPU and model ----------------------------------------------------------------------

    def gpu_entry(self) -> dict[str, Any] | None:
        cap = self.s.gpu_compute_cap
        entry = self.kb.gpus.get(cap)
        if entry is None:
            self.error(
                f"gpu_compute_cap {cap!r} {self.where('gpu_compute_cap')} is not in the knowledge "
                f"base; accepted: {', '.join(self.kb.gpus)}"
            )
        return entry

    def model_architecture(self) -> dict[str, Any] | None:
        """The architecture entry of the model, after checking the release serves it."""
        s, kb = self.s, self.kb
        known = kb.models.get(s.model_name)
        model = self.facts.model
        arch = model.architecture if model is not None and model.architecture else None
        if arch is None and known is not None:
            arch = known["architecture"]
        if arch is None:
            self.plan.warnings.append(
                f"model {s.model_name!r}: architecture unknown until model_source "
                f"{s.model_source} holds a config.json; model support is not checked yet"
            )
            return None
        entry = kb.architectures.get(arch)
        if entry is None:
            self.error(
                f"model_name {s.model_name!r} {self.where('model_name')}: architecture {arch} is "
                "not in the knowledge base; add it under 'architectures' in "
                "operations/knowledge/sglang.yaml with the first release that serves it"
            )
            return None
        release = s.sglang_version
        if version(release) < version(entry["first_release"]):
            self.error(
                f"sglang_version {release!r} {self.where('sglang_version')} does not serve "
                f"{arch} ({s.model_name}): first served by sglang {entry['first_release']} "
                f"({_src(kb, entry)})"
            )
        elif known is not None and version(release) < version(known.get("min_release", "0")):
            self.error(
                f"sglang_version {release!r} {self.where('sglang_version')} cannot serve "
                f"{s.model_name}: it needs sglang >= {known['min_release']} ({_src(kb, known)})"
            )
        return entry

    # -- attention backend ------------------------------------------------------------------

    def backend_refusals(self, backend: str, hybrid: bool) -> list[str]:
        """Why `backend` cannot run here; empty when it can."""
        s, kb = self.s, self.kb
        cap = s.gpu_compute_cap
        arch = kb.gpus.get(cap, {}).get("arch", cap)
        entry = kb.attention_backends.get(backend)
        if entry is None:
            return [
                f"{backend!r} is not a known backend (known: {', '.join(kb.attention_backends)})"
            ]
        reasons = []
        if ("runs_on" in entry and cap not in entry["runs_on"]) or cap in entry.get(
            "refused_on", []
        ):
            reasons.append(f"{entry['reason']}; this GPU is {arch} ({_src(kb, entry)})")
        if hybrid:
            rule = kb.hybrid_backends(s.sglang_version)
            if rule is None:
                reasons.append(
                    f"the knowledge base has no data on which backends sglang "
                    f"{s.sglang_version} accepts for hybrid linear-attention models"
                )
            elif backend not in rule["backends"]:
                why = rule.get("reason", "")
                reasons.append(
                    f"sglang {s.sglang_version} accepts only {', '.join(rule['backends'])} for "
                    f"hybrid linear-attention models{'; ' + why if why else ''} ({_src(kb, rule)})"
                )
        spec = kb.speculative
        if backend == "flashinfer" and s.speculative is not None and self.release_known:
            flashinfer = kb.releases[s.sglang_version]["flashinfer"]
            if version(flashinfer) <= version(spec["flashinfer_newer_than"]):
                reasons.append(
                    f"{spec['flashinfer_reason']}; sglang {s.sglang_version} pins flashinfer "
                    f"{flashinfer} ({_src(kb, spec)})"
                )
        if self.table is not None:
            option = self.table.get("--attention-backend")
            if option is not None and option.choices is not None and backend not in option.choices:
                reasons.append(
                    f"sglang {s.sglang_version}'s --attention-backend has no {backend!r}"
                )
        return reasons

    def attention_backend(self, hybrid: bool) -> str | None:
        s, kb = self.s, self.kb
        if s.attention_backend != "auto":
            reasons = self.backend_refusals(s.attention_backend, hybrid)
            if reasons:
                self.error(
                    f"attention_backend {s.attention_backend!r} "
                    f"{self.where('attention_backend')} cannot run with sglang "
                    f"{s.sglang_version} on compute capability {s.gpu_compute_cap}: "
                    + "; ".join(reasons)
                )
                return None
            self.plan.decisions.append(Decision("attention backend", s.attention_backend, "set"))
            return s.attention_backend
        rule = kb.auto_rule(s.gpu_compute_cap)
        if rule is None:
            self.error(
                f"attention_backend 'auto': the knowledge base has no preference for compute "
                f"capability {s.gpu_compute_cap}; set attention_backend explicitly"
            )
            return None
        skipped: list[str] = []
        prefer: list[str] = rule["prefer"]
        for backend in prefer:
            reasons = self.backend_refusals(backend, hybrid)
            if not reasons:
                why = rule["why"] + (f"; skipped {'; '.join(skipped)}" if skipped else "")
                self.plan.decisions.append(
                    Decision("attention backend", backend, f"auto: {why} ({_src(kb, rule)})")
                )
                if skipped:
                    self.plan.warnings.append(
                        f"attention_backend auto chose {backend}: skipped {'; '.join(skipped)}"
                    )
                return backend
            skipped.append(f"{backend} ({reasons[0]})")
        self.error(
            f"attention_backend 'auto': no backend runs with sglang {s.sglang_version} on "
            f"compute capability {s.gpu_compute_cap}: {'; '.join(skipped)}"
        )
        return None

    # -- renamed flags ----------------------------------------------------------------------

    def renamed_flag(self, setting: str) -> str | None:
        if not self.release_known:
            return None
        rule = self.kb.flag(setting, self.s.sglang_version)
        if rule is None or rule["option"] is None:
            self.error(
                f"{setting} {self.where(setting)}: sglang {self.s.sglang_version} has no option "
                "for it; leave it unset"
            )
            return None
        return str(rule["option"])

    # -- the command line -------------------------------------------------------------------

    def server_args(self, hybrid: bool, backend: str | None) -> list[str]:
        s = self.s
        args = [
            "--model-path",
            staged_model_path(s),
            "--served-model-name",
            s.model_name,
            "--host",
            s.server_host,
        ]
        if backend is not None:
            args += ["--attention-backend", backend]
        args += ["--mem-fraction-static", f"{s.mem_fraction_static:g}"]
        if hybrid:
            option = self.renamed_flag("mamba_cache_strategy")
            if option:
                args += [option, s.mamba_cache_strategy]
        if s.cuda_graph_max_bs is not None:
            option = self.renamed_flag("cuda_graph_max_bs")
            if option:
                args += [option, str(s.cuda_graph_max_bs)]
        if s.speculative is not None:
            spec = s.speculative
            need = self.kb.speculative["hybrid_requires_mamba_strategy"]
            if hybrid and s.mamba_cache_strategy != need:
                self.error(
                    f"mamba_cache_strategy {s.mamba_cache_strategy!r} "
                    f"{self.where('mamba_cache_strategy')}: "
                    f"{self.kb.speculative['hybrid_reason']}; accepted with speculative: {need} "
                    f"({_src(self.kb, self.kb.speculative)})"
                )
            args += ["--speculative-algorithm", spec.algorithm]
            for name, value in (
                ("--speculative-num-steps", spec.num_steps),
                ("--speculative-eagle-topk", spec.eagle_topk),
                ("--speculative-num-draft-tokens", spec.num_draft_tokens),
            ):
                if value is not None:
                    args += [name, str(value)]
        if s.enable_metrics:
            args.append("--enable-metrics")
        if s.api_key_file:
            # The key itself travels in a root/service-user-only file, never on a command line.
            args += ["--config", SECRETS_FILE]
        return args

    def check_extra_args(self) -> None:
        for arg in self.s.extra_server_args:
            option = arg.split("=", 1)[0]
            if option in MANAGED_OPTIONS:
                key = MANAGED_OPTIONS[option]
                self.error(
                    f"extra_server_args {self.where('extra_server_args')}: {option} is managed "
                    f"by the setting {key!r}; set that instead"
                )

    def check_against_cli(self, args: list[str], origin: str) -> None:
        """Refuse anything the pinned release's own parser would reject."""
        if self.table is None:
            return
        errors, warnings = cli_problems(args, self.table, origin)
        self.plan.errors.extend(errors)
        self.plan.warnings.extend(warnings)

    # -- ranks --------------------------------------------------------------------------------

    def ranks(self, args: list[str]) -> None:
        s = self.s
        if s.dp_size > s.gpu_count:
            self.error(
                f"dp_size {s.dp_size} {self.where('dp_size')} is more than gpu_count "
                f"{s.gpu_count} {self.where('gpu_count')}: one rank per GPU; accepted: 1 to "
                f"{s.gpu_count}"
            )
            return
        if s.base_port + s.dp_size - 1 > 65535:
            self.error(f"base_port {s.base_port} {self.where('base_port')}: ranks run past 65535")
            return
        python = f"{s.engine_root}/current/bin/python"
        env_template = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            keep_trailing_newline=True,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
        ).get_template("sglang-rank.service.j2")
        for rank in range(s.dp_size):
            port = s.base_port + rank
            argv = [python, "-m", "sglang.launch_server", *args, "--port", str(port)]
            env = {"CUDA_VISIBLE_DEVICES": str(rank)}
            unit = env_template.render(
                rank=rank,
                gpu=rank,
                port=port,
                model_name=s.model_name,
                engine_root=s.engine_root,
                user=s.service_user,
                env=env,
                exec_start=" ".join(systemd_quote(a) for a in argv),
                stage_unit=STAGE_UNIT,
                start_timeout_s=START_TIMEOUT_S,
            )
            self.plan.ranks.append(Rank(rank, rank, port, argv, env, unit_name(rank), unit))

    def run(self) -> HostPlan:
        self.check_release()
        self.check_lane()
        self.gpu_entry()
        arch = self.model_architecture()
        hybrid = bool(arch and arch["hybrid_linear_attention"])
        backend = self.attention_backend(hybrid)
        self.check_extra_args()
        args = self.server_args(hybrid, backend)
        self.check_against_cli(args, "resolved command line")
        self.check_against_cli(list(self.s.extra_server_args), "extra_server_args")
        if self.plan.errors:
            return self.plan
        self.ranks(args + list(self.s.extra_server_args))
        return self.plan


ROUTER_UNIT = "sglang-router.service"


@dataclass(frozen=True)
class RouterPlan:
    argv: list[str]
    unit: str
    workers: list[str]
    health_url: str
    env_dir: str
    version: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def router_env_dir(settings: Settings) -> str:
    version = settings.router.version if settings.router else "none"
    return f"{settings.engine_root}/router/sglang-router-{version}"


def worker_urls(all_settings: list[tuple[str, Settings]]) -> list[str]:
    """Every rank of every host, as the router reaches it."""
    urls = []
    for _, s in all_settings:
        address = f"[{s.server_host}]" if ":" in s.server_host else s.server_host
        urls += [f"http://{address}:{s.base_port + rank}" for rank in range(s.dp_size)]
    return urls


def resolve_router(
    settings: Settings, host_name: str, all_settings: list[tuple[str, Settings]]
) -> RouterPlan:
    """The router's command line and unit, for the host that runs it."""
    router = settings.router
    assert router is not None and router.host == host_name
    env_dir = router_env_dir(settings)
    workers = worker_urls(all_settings)
    argv = [
        f"{env_dir}/bin/python",
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        *workers,
        "--policy",
        router.policy,
        "--host",
        router.bind,
        "--port",
        str(router.port),
    ]
    errors: list[str] = []
    warnings: list[str] = []
    table = kbmod.load_cli_table("sglang-router", router.version)
    if table is None:
        errors.append(
            f"router version {router.version!r}: no option table for sglang-router "
            f"{router.version}; run 'python scripts/gen_cli_table.py sglang-router "
            f"{router.version}' (see operations/knowledge/cli/README.md)"
        )
    else:
        found, warned = cli_problems(argv[3:], table, "router command line")
        errors += found
        warnings += warned
    for name, s in all_settings:
        ports = range(s.base_port, s.base_port + s.dp_size)
        if name == host_name and router.port in ports:
            errors.append(
                f"router port {router.port} (set in {settings.origin('router')}) collides with "
                f"rank {router.port - s.base_port} of {name} (ports {ports.start}-{ports.stop - 1})"
                "; choose a router port outside every host's rank ports"
            )
        if name != host_name and s.server_host.startswith("127."):
            warnings.append(
                f"router on {host_name} reaches {name}'s ranks at {s.server_host}, a loopback "
                "address: set server_host for that host to an address the router can reach"
            )
    bind = "127.0.0.1" if router.bind in ("0.0.0.0", "::") else router.bind
    unit = (
        jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            keep_trailing_newline=True,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
        )
        .get_template("sglang-router.service.j2")
        .render(
            version=router.version,
            workers=workers,
            port=router.port,
            user=settings.service_user,
            exec_start=" ".join(systemd_quote(a) for a in argv),
        )
    )
    return RouterPlan(
        argv=argv,
        unit=unit,
        workers=workers,
        health_url=f"http://{bind}:{router.port}/health",
        env_dir=env_dir,
        version=router.version,
        errors=errors,
        warnings=warnings,
    )


def cli_problems(
    args: list[str], table: kbmod.CliTable, origin: str
) -> tuple[list[str], list[str]]:
    """(errors, warnings) for `args` under a release's real option table: unknown options,
    missing or unexpected values, values outside the option's choices."""
    errors: list[str] = []
    warnings: list[str] = []
    release = f"{table.package} {table.version}"
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if not word.startswith("--"):
            errors.append(f"{origin}: {word!r} is not an option (options start with --)")
            continue
        name, eq, inline = word.partition("=")
        option = table.get(name)
        if option is None:
            close = _close_options(name, table.options)
            hint = f"; did you mean {close}?" if close else ""
            errors.append(f"{origin}: {release} has no option {name}{hint}")
            continue
        if option.deprecated:
            warnings.append(f"{origin}: {name} is deprecated in {release}")
        values: list[str] = []
        if eq and not option.takes_value:
            errors.append(f"{origin}: {name} takes no value")
        elif eq:
            values = [inline]
        elif option.takes_value:
            many = option.nargs in ("*", "+") or isinstance(option.nargs, int)
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
                if not many:
                    break
            if not values and option.nargs not in ("?", "*"):
                errors.append(f"{origin}: {name} needs a value")
        for value in values:
            if option.choices is not None and value not in option.choices:
                errors.append(
                    f"{origin}: {name} {value!r} is not accepted by {release}; "
                    f"accepted: {', '.join(option.choices)}"
                )
    return errors, warnings


def _close_options(name: str, options: dict[str, Any]) -> str | None:
    import difflib

    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.7)
    return close[0] if close else None


def resolve(
    settings: Settings, facts: Facts | None = None, kb: Knowledge | None = None
) -> HostPlan:
    return _Resolution(settings, facts or Facts(), kb or kbmod.load()).run()
