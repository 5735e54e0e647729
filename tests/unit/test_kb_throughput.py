"""knowledge/throughput.yaml as operations/kb/throughput.py loads it: the card's ceilings found by
the names nvidia-smi prints, the two ceilings a measurement is read against, the levers with
their sources, the public reference figures, and a broken file refused key by key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from operations.kb import KnowledgeError
from operations.kb.throughput import (
    LEVERS,
    THROUGHPUT_FILE,
    GpuCeiling,
    ceilings,
    load_throughput,
)
from tests.unit.builders import gpu_facts


def rtx_pro_6000() -> GpuCeiling:
    found = load_throughput().gpu_named("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert found is not None
    return found


def test_the_card_nvidia_smi_names_has_its_ceilings_with_sources() -> None:
    # The names the real nvidia-smi fixtures print (tests/fixtures/nvidia-smi/).
    names = {g.name for g in gpu_facts("rtx-pro-6000-x8").gpus}
    assert names and all(load_throughput().gpu_named(n) is not None for n in names)
    gpu = rtx_pro_6000()
    assert (gpu.memory_bandwidth_gb_s, gpu.dense_bf16_tflops) == (1792.0, 504.0)
    assert gpu.compute_cap == "12.0"
    assert {s.id for s in gpu.source} == {"rtx-pro-6000-bandwidth", "rtx-pro-6000-tflops"}
    assert load_throughput().gpu_named("NVIDIA GeForce RTX 5090") is None


def test_the_ceilings_of_qwen36_27b_on_one_rtx_pro_6000() -> None:
    """The issue's figures, by hand: 1,792 GB/s / 54 GB = 33.2 tok/s for one bf16 stream
    (61.8 for 29 GB of FP8); 504e12 / (2 * 27e9) = 9,333 tokens/s for a full batch."""
    single, full = ceilings(rtx_pro_6000(), 54e9, 27e9)
    assert single == pytest.approx(33.19, abs=0.01)
    assert full == pytest.approx(9333.3, abs=0.1)
    fp8_single, fp8_full = ceilings(rtx_pro_6000(), 29e9, 27e9)
    assert fp8_single == pytest.approx(61.79, abs=0.01)
    assert fp8_full == full  # bf16 compute: the parameters, not their bytes


@pytest.mark.parametrize(("size", "params"), [(0, 27e9), (54e9, 0), (-1, 27e9)])
def test_ceilings_refuse_a_model_of_no_size(size: float, params: float) -> None:
    with pytest.raises(ValueError, match="must be above 0"):
        ceilings(rtx_pro_6000(), size, params)


def test_every_lever_the_plan_decides_is_known_with_its_sources() -> None:
    known = load_throughput()
    assert set(known.levers) == set(LEVERS)
    assert known.lever("max_running_requests").speculative_cap == 48
    assert known.lever("cuda_graph_max_bs").release_default == 256
    assert known.lever("chunked_prefill_size").release_default == 8192
    cap = {s.id for s in known.lever("max_running_requests").source}
    assert {"sglang-spec-cap-0511", "sglang-spec-cap-0523"} <= cap
    for lever in known.levers.values():
        assert lever.why and lever.source, lever.name
        assert all(s.url.startswith("https://") for s in lever.source), lever.name


def test_the_reference_figures_are_the_public_ones_with_their_sources() -> None:
    figures = {(r.what, r.concurrency, r.counts): r for r in load_throughput().reference}
    rtx = "Qwen3.5-27B-FP8, one RTX PRO 6000, SGLang without MTP"
    assert figures[(rtx, 16, "output")].tok_s == 579
    assert figures[(rtx, 64, "output")].tok_s == 1523
    b200 = "Qwen3.6-27B bf16, one B200, SGLang 0.5.15, random 8192/1024"
    assert figures[(b200, 1024, "total")].tok_s == 12154
    assert [s.id for s in figures[(b200, 1024, "total")].source] == ["sglang-cookbook-qwen36-bench"]
    assert [s.id for s in figures[(rtx, 16, "output")].source] == ["rtx6kpro-sglang-27b-fp8"]


def broken(tmp_path: Path, change: Any) -> Path:
    data = yaml.safe_load(THROUGHPUT_FILE.read_text())
    change(data)
    path = tmp_path / "throughput.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["levers"]["speculative"].update(source="nowhere"),
            "levers.speculative: source 'nowhere' is not a key of sources",
        ),
        (lambda d: d["levers"].pop("fp8_checkpoint"), "levers: fp8_checkpoint is missing"),
        (
            lambda d: d["levers"].update(page_size={"why": "x", "source": "sglang-lever-help"}),
            "levers.page_size: not a lever the plan decides",
        ),
        (
            lambda d: d["gpus"]["rtx-pro-6000-blackwell"].update(memory_bandwidth_gb_s=0),
            "gpus.rtx-pro-6000-blackwell.memory_bandwidth_gb_s: 0",
        ),
        (lambda d: d["reference"][0].update(counts="input"), "reference[0].counts: 'input'"),
        (
            lambda d: d["levers"]["max_running_requests"].pop("speculative_cap"),
            "levers.max_running_requests: no speculative_cap",
        ),
    ],
)
def test_a_broken_file_is_refused_by_key(tmp_path: Path, change: Any, message: str) -> None:
    with pytest.raises(KnowledgeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_throughput(broken(tmp_path, change))
