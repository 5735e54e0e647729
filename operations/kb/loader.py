"""Loads knowledge/sglang.yaml into the typed model, checked: schema.json first, then the
cross-references a schema cannot express, every problem at once, each named by its key.
"""

from __future__ import annotations

import contextlib
import copyreg
import hashlib
import importlib.util
import json
import os
import pickle
import sys
from collections.abc import Mapping
from dataclasses import fields
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import cast

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from operations.kb.cross_checks import cross_problems
from operations.kb.raw import (
    KNOWLEDGE_DIR,
    KnowledgeError,
    RawBackend,
    RawCites,
    RawCompiler,
    RawKnowledge,
    RawLimits,
    RawOverride,
    RawRelease,
    RawRouter,
    parse_yaml,
)
from operations.kb.types import (
    Architecture,
    AttentionBackend,
    AutoBackend,
    Cites,
    Compiler,
    CompilerArchive,
    Exclude,
    Flag,
    Flags,
    Gpu,
    GpuRule,
    HybridBackends,
    Knowledge,
    KnownModel,
    Lane,
    LaneBuild,
    NoBufferLimits,
    NoBufferRule,
    Override,
    PackageBuild,
    PythonSupport,
    RankEnvironment,
    RankMetrics,
    Release,
    RouterControlPlane,
    RouterDrain,
    RouterEngines,
    RouterHealth,
    RouterPolicy,
    RouterRelease,
    RouterWorkerKey,
    Source,
    Speculative,
    Spelling,
    StartAssert,
    Unproven,
)
from operations.settings import verdicts

# -- the loader ------------------------------------------------------------------------------


class _Reader:
    """Turns schema-valid data into typed entries, noting every problem by its key."""

    def __init__(self, raw: RawKnowledge) -> None:
        self.raw = raw
        self.problems: list[str] = []
        self.sources = {sid: Source(sid, s["what"], s["url"]) for sid, s in raw["sources"].items()}
        self.cited: set[str] = set()

    def cites(self, where: str, raw: RawCites) -> Cites:
        found = []
        for sid in [raw] if isinstance(raw, str) else raw:
            source = self.sources.get(sid)
            if source is None:
                self.problems.append(f"{where}: unknown source {sid!r}")
            else:
                self.cited.add(sid)
                found.append(source)
        return tuple(found)

    def releases(self, where: str, specifier: str, key: str = "releases") -> str:
        try:
            SpecifierSet(specifier)
        except InvalidSpecifier:
            self.problems.append(f"{where}.{key}: {specifier!r} is not a version range")
            return "<0"  # matches no release: the load fails on the problem above anyway
        return specifier

    def compiler(self, lane: str, raw: RawCompiler) -> Compiler:
        return Compiler(
            raw["version"],
            raw["from"],
            raw.get("release"),
            raw["root"],
            tuple(
                CompilerArchive(name, a["version"], a["path"], a["sha256"], a["size"])
                for name, a in raw["archives"].items()
            ),
            raw["why"],
            self.cites(f"lanes.{lane}.compiler", raw["source"]),
        )

    def read(self) -> Knowledge:
        raw = self.raw
        gpus = {
            cap: Gpu(
                cap, g["arch"], g["family"], g["min_cuda"], self.cites(f"gpus.{cap}", g["source"])
            )
            for cap, g in raw["gpus"].items()
        }
        lanes = {
            name: Lane(
                name,
                lane["cuda"],
                lane["min_driver"],
                lane["toolkit_driver"],
                self.cites(f"lanes.{name}", lane["source"]),
                self.compiler(name, lane["compiler"]),
            )
            for name, lane in raw["lanes"].items()
        }
        releases = {
            number: self.release(number, entry, lanes) for number, entry in raw["releases"].items()
        }
        architectures = {
            name: Architecture(
                name,
                a["first_release"],
                a["hybrid_linear_attention"],
                self.cites(f"architectures.{name}", a["source"]),
            )
            for name, a in raw["architectures"].items()
        }
        models = {}
        for name, m in raw["models"].items():
            arch = architectures.get(m["architecture"])
            if arch is None:
                self.problems.append(f"models.{name}: unknown architecture {m['architecture']!r}")
                continue
            models[name] = KnownModel(
                name,
                arch,
                m.get("min_release"),
                m.get("size_gb"),
                self.cites(f"models.{name}", m["source"]),
                m.get("quantization"),
            )
        backends, hybrid, auto = self.attention()
        flags, speculative, no_buffer, environment = self.serving_rules()
        routers, start_asserts, router_policies = self.router_rules()
        self.problems += [
            f"sources.{sid}: cited by nothing" for sid in self.sources if sid not in self.cited
        ]
        return Knowledge(
            sources=MappingProxyType(self.sources),
            gpus=MappingProxyType(gpus),
            lanes=MappingProxyType(lanes),
            releases=MappingProxyType(releases),
            architectures=MappingProxyType(architectures),
            models=MappingProxyType(models),
            attention_backends=MappingProxyType(backends),
            hybrid_attention_backends=hybrid,
            auto_attention_backend=auto,
            flags=flags,
            speculative=speculative,
            mamba_no_buffer=no_buffer,
            rank_environment=environment,
            routers=MappingProxyType(routers),
            start_asserts=start_asserts,
            router_policies=router_policies,
        )

    def attention(
        self,
    ) -> tuple[dict[str, AttentionBackend], tuple[HybridBackends, ...], tuple[AutoBackend, ...]]:
        """The attention backends, the hybrid models' and the automatic choice's rules."""
        raw = self.raw
        backends = {name: self.backend(name, b) for name, b in raw["attention_backends"].items()}
        hybrid = tuple(
            HybridBackends(
                self.releases(f"hybrid_attention_backends[{i}]", h["releases"]),
                tuple(h["backends"]),
                h.get("reason"),
                self.cites(f"hybrid_attention_backends[{i}]", h["source"]),
            )
            for i, h in enumerate(raw["hybrid_attention_backends"])
        )
        auto = tuple(
            AutoBackend(
                tuple(a["compute_caps"]),
                tuple(a["prefer"]),
                a["why"],
                self.cites(f"auto_attention_backend[{i}]", a["source"]),
            )
            for i, a in enumerate(raw["auto_attention_backend"])
        )
        return backends, hybrid, auto

    def serving_rules(
        self,
    ) -> tuple[Flags, Speculative, tuple[NoBufferRule, ...], tuple[RankEnvironment, ...]]:
        """Flags' spellings, speculative decoding, mamba's no-buffer rules, rank environment."""
        raw = self.raw
        flags = Flags(**{f.name: self.flag(f.name) for f in fields(Flags)})
        s = raw["speculative"]
        speculative = Speculative(
            s["hybrid_requires_mamba_strategy"],
            s["hybrid_reason"],
            s["flashinfer_newer_than"],
            s["flashinfer_reason"],
            self.cites("speculative", s["source"]),
            s.get("hybrid_max_draft_tokens"),
            s.get("hybrid_max_draft_tokens_reason", ""),
        )
        no_buffer = tuple(
            NoBufferRule(
                self.releases(f"mamba_no_buffer[{i}]", r["releases"]),
                _limits(r.get("refuses", {})),
                _limits(r.get("warns", {})),
                r["reason"],
                self.cites(f"mamba_no_buffer[{i}]", r["source"]),
                tuple(r.get("adds", [])),
            )
            for i, r in enumerate(raw["mamba_no_buffer"])
        )
        environment = tuple(
            RankEnvironment(
                e["variable"],
                e["value"],
                self.releases(f"rank_environment[{i}]", e["flashinfer"], "flashinfer"),
                tuple(e["compute_caps"]),
                self.releases(f"rank_environment[{i}]", e["compiler"], "compiler"),
                e["why"],
                self.cites(f"rank_environment[{i}]", e["source"]),
                e.get("driver_below"),
            )
            for i, e in enumerate(raw["rank_environment"])
        )
        return flags, speculative, no_buffer, environment

    def router_rules(
        self,
    ) -> tuple[dict[str, RouterRelease], tuple[StartAssert, ...], tuple[RouterPolicy, ...]]:
        """The router's releases, the start asserts and the router policies, by field."""
        raw = self.raw
        routers = {number: self.router(number, r) for number, r in raw.get("routers", {}).items()}
        start_asserts = tuple(
            StartAssert(
                a["function"],
                a.get("match"),
                a.get("anticipated"),
                a.get("unreachable"),
                self.cites(f"start_asserts[{i}]", a["source"]),
            )
            for i, a in enumerate(raw["start_asserts"])
        )
        router_policies = tuple(
            RouterPolicy(
                r["policy"],
                self.releases(f"router_policies[{i}]", r["releases"]),
                r["reason"],
                self.cites(f"router_policies[{i}]", r["source"]),
            )
            for i, r in enumerate(raw.get("router_policies", []))
        )
        return routers, start_asserts, router_policies

    def router(self, number: str, r: RawRouter) -> RouterRelease:
        where = f"routers.{number}"
        drain = r.get("drain")
        plane = r.get("control_plane")
        worker_key = r.get("worker_api_key")
        health = r.get("health")
        metrics = r.get("rank_metrics")
        engines = r.get("engines")
        return RouterRelease(
            number,
            r["list_workers"],
            r["remove_worker"],
            r["add_worker"],
            r["why"],
            self.cites(where, r["source"]),
            package=r["package"],
            commands=tuple(r["commands"]),
            launcher=r["launcher"],
            update_worker=r.get("update_worker"),
            worker_states=tuple(r.get("worker_states", [])),
            duplicate_add_status=r.get("duplicate_add_status"),
            drain=None
            if drain is None
            else RouterDrain(
                drain["state"],
                drain["settle_secs"],
                drain["settle_update"],
                drain["settle_applied"],
                drain["waits_for_in_flight"],
                drain["why"],
                self.cites(f"{where}.drain", drain["source"]),
            ),
            control_plane=None
            if plane is None
            else RouterControlPlane(
                plane["key_format"],
                plane["missing_key_status"],
                plane["from_option"],
                plane["no_environment"],
                plane["why"],
                self.cites(f"{where}.control_plane", plane["source"]),
            ),
            worker_api_key=None
            if worker_key is None
            else RouterWorkerKey(
                worker_key["field"],
                worker_key["why"],
                self.cites(f"{where}.worker_api_key", worker_key["source"]),
            ),
            health=None
            if health is None
            else RouterHealth(
                MappingProxyType(dict(health["options"])),
                health["rules"],
                self.cites(f"{where}.health", health["source"]),
            ),
            rank_metrics=None
            if metrics is None
            else RankMetrics(
                metrics["prefix"],
                tuple(metrics["gauges"]),
                metrics["why"],
                self.cites(f"{where}.rank_metrics", metrics["source"]),
            ),
            engines=None
            if engines is None
            else RouterEngines(
                tuple(engines["tested"]),
                self.releases(f"{where}.engines", engines["unproven"], "unproven"),
                engines["why"],
                self.cites(f"{where}.engines", engines["source"]),
            ),
        )

    def release(self, number: str, raw: RawRelease, lanes: Mapping[str, Lane]) -> Release:
        where = f"releases.{number}"
        shared = tuple(
            self.override(f"{where}.overrides[{i}]", o)
            for i, o in enumerate(raw.get("overrides", []))
        )
        builds = []
        for lane_name, build in raw["builds"].items():
            at = f"{where}.builds.{lane_name}"
            lane = lanes.get(lane_name)
            if lane is None:
                self.problems.append(f"{at}: unknown lane {lane_name!r}")
                continue
            packages = tuple(
                PackageBuild(
                    name=canonicalize_name(name),
                    version=p["version"],
                    index=p["index"],
                    index_lane=p.get("index_lane", lane_name),
                    source=self.cites(f"{at}.packages.{name}", p["source"]),
                )
                for name, p in build["packages"].items()
            )
            own = tuple(
                self.override(f"{at}.overrides[{i}]", o)
                for i, o in enumerate(build.get("overrides", []))
            )
            unproven = tuple(
                Unproven(u["what"], self.cites(f"{at}.unproven[{i}]", u["source"]))
                for i, u in enumerate(build.get("unproven", []))
            )
            excludes = tuple(
                Exclude(
                    canonicalize_name(x["package"]),
                    x["replaces"],
                    self.cites(f"{at}.excludes[{i}]", x["source"]),
                )
                for i, x in enumerate(build.get("excludes", []))
            )
            builds.append(LaneBuild(lane, packages, shared + own, unproven, excludes))
        return Release(
            version=number,
            glibc=raw["glibc"],
            python=PythonSupport(
                versions=tuple(raw["python"]["versions"]),
                why=raw["python"]["why"],
                source=self.cites(f"{where}.python", raw["python"]["source"]),
            ),
            requires=tuple(raw["requires"]),
            builds=tuple(builds),
            source=self.cites(where, raw["source"]),
        )

    def override(self, where: str, raw: RawOverride) -> Override:
        return Override(raw["requirement"], raw["replaces"], self.cites(where, raw["source"]))

    def backend(self, name: str, raw: RawBackend) -> AttentionBackend:
        where = f"attention_backends.{name}"
        runs_on = raw.get("runs_on")
        chips = GpuRule(
            runs_on=tuple(runs_on) if runs_on is not None else None,
            refused_on=tuple(raw.get("refused_on", [])),
            reason=raw.get("reason", ""),
            source=self.cites(where, raw["source"]),
        )
        by_release = tuple(
            GpuRule(
                runs_on=tuple(r["runs_on"]),
                refused_on=(),
                reason=r["reason"],
                source=self.cites(f"{where}.by_release[{i}]", r["source"]),
                releases=self.releases(f"{where}.by_release[{i}]", r["releases"]),
            )
            for i, r in enumerate(raw.get("by_release", []))
        )
        return AttentionBackend(name, chips, by_release)

    def flag(self, setting: str) -> Flag:
        where = f"flags.{setting}"
        return Flag(
            setting,
            tuple(
                Spelling(
                    self.releases(f"{where}[{i}]", s["releases"]),
                    s["option"],
                    s.get("note"),
                    self.cites(f"{where}[{i}]", s["source"]),
                )
                for i, s in enumerate(self.raw["flags"][setting])
            ),
        )


def _limits(raw: RawLimits) -> NoBufferLimits:
    return NoBufferLimits(
        tuple(raw.get("attention_backends", [])), raw.get("page_size_other_than_1", False)
    )


def build(data: object) -> Knowledge:
    """Typed knowledge from the data of knowledge/sglang.yaml, checked against schema.json and
    its cross-references; KnowledgeError names every broken key."""
    schema = json.loads((KNOWLEDGE_DIR / "schema.json").read_text())
    errors = verdicts.errors(schema, data)
    if errors:
        lines = [f"{'.'.join(map(str, e.path)) or '<top>'}: {e.message}" for e in errors]
        raise KnowledgeError("knowledge/sglang.yaml is invalid:\n  " + "\n  ".join(lines))
    reader = _Reader(cast(RawKnowledge, data))  # the schema has checked this shape
    kb = reader.read()
    problems = reader.problems + list(cross_problems(kb))
    if problems:
        raise KnowledgeError("knowledge/sglang.yaml is inconsistent:\n  " + "\n  ".join(problems))
    return kb


@cache
def load() -> Knowledge:
    """The knowledge base, checked. Built from knowledge/ the first time these very files are
    read (and whenever one of them, or the code that builds and checks them, changes);
    otherwise the checked result of that build is read back (`_remembered`)."""
    key = _inputs_key()
    kept = _remembered(key)
    if kept is not None:
        return kept
    text = (KNOWLEDGE_DIR / "sglang.yaml").read_text()
    # raw.parse_yaml: libyaml's safe loader, 5 ms here where pure Python takes 170 ms.
    knowledge = build(parse_yaml(text))
    _remember(key, knowledge)
    return knowledge


# -- the checked knowledge, remembered --------------------------------------------------------
# Parsing sglang.yaml and checking it against its schema and the 19 releases' CLI tables (2 MB
# of JSON) cost ~80 ms of every converged deploy (bench/serve_bench.py), for a verdict that
# cannot have changed while none of its inputs did. The built Knowledge is kept beside this
# package's bytecode, under a digest of every input: each file of knowledge/, the code that
# builds and checks it (this package, operations/settings/verdicts.py and the installed
# jsonschema), the
# Python, `packaging` and PyYAML it was built with. A change to any is another name, hence a
# fresh build with every check; a build that fails is never kept. Written when Python writes
# bytecode, where .pyc files are, and trusted as they are: whoever can write there can change
# the code the controller runs (as operations/render/host_scripts.py does).
KEPT_DIR = Path(importlib.util.cache_from_source(__file__)).parent
KEPT_PREFIX = "knowledge-"


def _inputs_key() -> str:
    import packaging

    versions = f"{sys.version}\0packaging {packaging.__version__}\0PyYAML {yaml.__version__}"
    # The schema's checker: verdicts.py and the installed jsonschema's files.
    sha = hashlib.sha256(versions.encode() + verdicts.checker())
    code = [*sorted(Path(__file__).parent.glob("*.py")), Path(verdicts.__file__)]
    data = sorted(p for p in KNOWLEDGE_DIR.rglob("*") if p.is_file())
    for path in (*code, *data):
        body = path.read_bytes()
        sha.update(f"\0{path.name}\0{len(body)}\0".encode() + body)
    return sha.hexdigest()[:32]


def _kept_path(key: str) -> Path:
    return KEPT_DIR / f"{KEPT_PREFIX}{key}.pickle"


def _remembered(key: str) -> Knowledge | None:
    try:
        with open(_kept_path(key), "rb") as kept:
            found = pickle.load(kept)
    except Exception:  # anything unreadable is built afresh, with every check
        return None
    return found if isinstance(found, Knowledge) else None


def _proxy(items: dict[str, object]) -> Mapping[str, object]:
    """A read-only mapping again, as the loader made it (pickle cannot name mappingproxy)."""
    return MappingProxyType(items)


def _remember(key: str, knowledge: Knowledge) -> None:
    if sys.dont_write_bytecode:
        return
    path = _kept_path(key)
    with contextlib.suppress(OSError, pickle.PicklingError, TypeError):
        path.parent.mkdir(parents=True, exist_ok=True)
        # Renamed into place: a reader never sees half a file.
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        with open(temp, "wb") as out:
            pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
            pickler.dispatch_table = copyreg.dispatch_table.copy()
            pickler.dispatch_table[MappingProxyType] = lambda m: (_proxy, (dict(m),))
            pickler.dump(knowledge)
        temp.replace(path)
        for old in path.parent.glob(f"{KEPT_PREFIX}*.pickle"):
            if old != path:
                old.unlink(missing_ok=True)
