"""Which files make a model directory's tokenizer: the one rule the ModelSource fact's scan
(stage_manifest.describe, before any change) and the throughput check (programs/throughput.py,
on the staged copy) both read.

SGLang's benchmark client loads the tokenizer with transformers' AutoTokenizer from the
directory it is given (`--tokenizer MODEL_DIR`, offline: HF_HUB_OFFLINE); a fast tokenizer
needs tokenizer.json, a slow one tokenizer.model (SentencePiece), and either reads
tokenizer_config.json (transformers tokenization_utils_base.py, PreTrainedTokenizerBase
vocab_files_names / from_pretrained). Qwen3.6-27B's repository holds tokenizer.json and
tokenizer_config.json beside vocab.json and merges.txt.
"""

from __future__ import annotations

# Any one of them at the top of the model directory: the client can load a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def tokenizer_files(names: list[str]) -> list[str]:
    """The tokenizer files among `names` (paths relative to the model directory), sorted."""
    return sorted(name for name in names if name in TOKENIZER_FILES)
