"""Stage the peers' allocator code for `bench/allocator_vs_peers.py`, at benchmark time.

Nothing of vLLM or nano-vllm is kept in this repository. Given where the
user keeps a copy of each project, `stage` copies only the files the block
allocators need into a git-ignored folder (`bench/_peers/`, emptied first),
writes small stubs of our own for the modules those files import but the
allocator path never uses, and puts the folder on `sys.path`. A copy can be:

- a bare git mirror (a directory with HEAD and objects): read with
  `git --git-dir=PATH show HEAD:FILE`;
- a source tree or an unpacked wheel (a directory holding `vllm/` or
  `nanovllm/`);
- a wheel or zip file (read without unpacking the rest).

What is copied and what is stubbed is listed in `VLLM_FILES`, `VLLM_STUBS`,
`NANO_FILES` and `NANO_STUBS`, and docs/BENCHMARKS.md says the same.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parent / "_peers"

# Copied verbatim: the allocator path of vLLM v1 (BlockPool, the free queue and
# block hashing, FullAttentionManager) and the helpers they call on it.
VLLM_FILES = (
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/kv_cache_spec_registry.py",
    "vllm/v1/hisparse/block_pool.py",
    "vllm/utils/hashing.py",
    "vllm/utils/math_utils.py",
)

# Our stubs, for imports the allocator path never exercises (events, metrics,
# multimodal inputs, logging, config) and for modules that pull in torch.
VLLM_STUBS: dict[str, str] = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/hisparse/__init__.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/distributed/__init__.py": "",
    "vllm/multimodal/__init__.py": "",
    "vllm/envs.py": "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False\n",
    "vllm/config.py": "class VllmConfig:\n    pass\n",
    "vllm/logger.py": "import logging\n\n\ndef init_logger(name):\n"
                      "    return logging.getLogger(name)\n",
    "vllm/multimodal/utils.py": "def get_mm_features_in_window(*args, **kwargs):\n"
                                "    raise NotImplementedError('stub: no multimodal input')\n",
    # KV events are off (enable_kv_cache_events=False): the classes are never built.
    "vllm/distributed/kv_events.py": (
        "MEDIUM_GPU = 'GPU'\nMEDIUM_CPU = 'CPU'\n\n\n"
        "class KVCacheEvent:\n    pass\n\n\n"
        "class BlockStored(KVCacheEvent):\n    pass\n\n\n"
        "class BlockRemoved(KVCacheEvent):\n    pass\n\n\n"
        "class AllBlocksCleared(KVCacheEvent):\n    pass\n"),
    # No metrics collector is passed, so only the name is needed.
    "vllm/v1/core/kv_cache_metrics.py": "class KVCacheMetricsCollector:\n    pass\n",
    "vllm/v1/utils.py": "def tensor_data(tensor):\n"
                        "    raise NotImplementedError('stub: no prompt embeds')\n",
    # The spec classes without torch: a full-attention spec carries what the
    # managers read of it (block_size, dcp_sharded, prefix_cacheable); every
    # other name is a bare class so that isinstance checks say no.
    "vllm/v1/kv_cache_interface.py": (
        "import enum\nfrom dataclasses import dataclass\n\n\n"
        "class KVCacheSpec:\n    pass\n\n\n"
        "class AttentionSpec(KVCacheSpec):\n    pass\n\n\n"
        "@dataclass\nclass FullAttentionSpec(AttentionSpec):\n"
        "    block_size: int\n    dcp_sharded: bool = False\n"
        "    prefix_cacheable: bool = True\n\n\n"
        + "".join(f"class {name}(KVCacheSpec):\n    pass\n\n\n" for name in (
            "ChunkedLocalAttentionSpec", "CircularBufferSpec", "CrossAttentionSpec",
            "HiddenStateCacheSpec", "HiSparseHotSpec", "HiSparseResidentSpec", "MambaSpec",
            "MLAAttentionSpec", "RSWASpec", "SinkFullAttentionSpec", "SlidingWindowMLASpec",
            "SlidingWindowSpec", "UniformTypeKVCacheSpecs"))
        + "class KVCacheConfig:\n    pass\n\n\nclass KVCacheGroupSpec:\n    pass\n\n\n"
        "class KVCacheGroupRole(enum.Enum):\n    HISPARSE_SOURCE = 'hisparse_source'\n\n\n"
        "def iter_layer_specs(*args, **kwargs):\n    raise NotImplementedError\n\n\n"
        "def get_mamba_prefill_checkpoint_position(*args, **kwargs):\n"
        "    raise NotImplementedError\n\n\n"
        "def is_mamba_prefill_checkpoint_valid(*args, **kwargs):\n"
        "    raise NotImplementedError\n"),
    # vllm.v1.request imports torch and the whole engine; the allocator reads
    # only these fields, and the block hasher runs where vLLM's Request runs it
    # (on construction and on every appended token).
    "vllm/v1/request.py": '''\
class Request:
    """Stub of vllm.v1.request.Request: the fields the KV cache manager reads."""

    def __init__(self, request_id, prompt_token_ids, block_hasher=None):
        self.request_id = request_id
        self._all_token_ids = list(prompt_token_ids)
        self.all_token_ids = self._all_token_ids
        self._output_token_ids = []
        self.num_prompt_tokens = len(self._all_token_ids)
        self.mm_features = []
        self.lora_request = None
        self.cache_salt = None
        self.prompt_embeds = None
        self.session_id = None
        self.shared_prefix_boundary = 0
        self._prompt_embeds_per_block_hashes = {}
        self.block_hashes = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    def append_output_token_ids(self, token_ids):
        if isinstance(token_ids, int):
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
        else:
            self._output_token_ids.extend(token_ids)
            self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self):
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    @property
    def num_tokens(self):
        return len(self._all_token_ids)
''',
    # hashing.py imports cbor2 for its CBOR hash variants, which are not used.
    "cbor2.py": "def dumps(*args, **kwargs):\n    raise NotImplementedError('stub')\n",
}

NANO_FILES = (
    "nanovllm/engine/block_manager.py",
    "nanovllm/engine/sequence.py",
    "nanovllm/sampling_params.py",
)

NANO_STUBS: dict[str, str] = {
    # The real package __init__ imports the LLM engine (torch, transformers).
    "nanovllm/__init__.py": "",
    "nanovllm/engine/__init__.py": "",
    # nano-vllm hashes blocks with xxhash's xxh64; the stub keeps its calls but
    # computes SHA-256 (first 8 bytes as the int digest), the hash PagedLab and
    # vLLM use here, so all three pay for the same hash function.
    "xxhash.py": '''\
import hashlib


class xxh64:
    """Stub of xxhash.xxh64 computing SHA-256 instead."""

    __slots__ = ("_h",)

    def __init__(self):
        self._h = hashlib.sha256()

    def update(self, data):
        self._h.update(data)

    def intdigest(self):
        return int.from_bytes(self._h.digest()[:8], "little")
''',
}


class Source:
    """Read-only access to one copy of a project: a git mirror, a tree or a wheel."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if path.is_file():
            self.kind = "zip"
        elif (path / "HEAD").is_file() and (path / "objects").is_dir():
            self.kind = "git"
        elif (path / ".git").exists():
            self.kind = "git"
            self.path = path / ".git"
        else:
            self.kind = "tree"

    def read(self, name: str) -> bytes:
        """The bytes of `name` in this copy; FileNotFoundError if it has none."""
        if self.kind == "zip":
            with zipfile.ZipFile(self.path) as zf:
                try:
                    return zf.read(name)
                except KeyError:
                    raise FileNotFoundError(f"{name} is not in {self.path}") from None
        if self.kind == "git":
            out = subprocess.run(["git", f"--git-dir={self.path}", "show", f"HEAD:{name}"],
                                 capture_output=True, check=False)
            if out.returncode:
                raise FileNotFoundError(f"{name} is not in {self.path}: "
                                        f"{out.stderr.decode(errors='replace').strip()}")
            return out.stdout
        return (self.path / name).read_bytes()

    def describe(self, version_file: str) -> str:
        """The version this copy holds: from `version_file`, plus the commit of a git mirror."""
        parts: list[str] = []
        try:
            text = self.read(version_file).decode()
        except FileNotFoundError:
            text = ""
        m = (re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text)
             or re.search(r"^version\s*=\s*['\"]([^'\"]+)", text, re.M))
        if m:
            parts.append(m.group(1))
        c = re.search(r"__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['\"]([^'\"]+)", text)
        if c:
            parts.append(f"({c.group(1)})")
        if self.kind == "git":
            def git(*args: str) -> str:
                out = subprocess.run(["git", f"--git-dir={self.path}", *args],
                                     capture_output=True, text=True, check=False)
                return out.stdout.strip()
            tag = git("describe", "--tags", "--abbrev=0")
            commit = git("rev-parse", "--short=12", "HEAD")
            parts.append(f"{tag + ', ' if tag else ''}commit {commit} of "
                         f"{git('log', '-1', '--format=%cs')}")
        return " ".join(parts) or "unknown version"


def _stage(root: Path, source: Source, files: tuple[str, ...], stubs: dict[str, str]) -> None:
    for name in files:
        dst = root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(source.read(name))
    for name, text in stubs.items():
        dst = root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)


def stage(vllm: Path, nano: Path) -> dict[str, str]:
    """Copy the peers' files and our stubs into PEERS_DIR and make them importable.

    Returns each peer's version. Raises FileNotFoundError if a copy lacks a
    file this benchmark needs (another layout, or another version).
    """
    if PEERS_DIR.exists():
        shutil.rmtree(PEERS_DIR)
    vsrc, nsrc = Source(vllm), Source(nano)
    _stage(PEERS_DIR / "vllm", vsrc, VLLM_FILES, VLLM_STUBS)
    _stage(PEERS_DIR / "nanovllm", nsrc, NANO_FILES, NANO_STUBS)
    (PEERS_DIR / ".gitignore").write_text("*\n")
    # nano-vllm's root goes first so its xxhash stub wins over an installed one.
    for root in (PEERS_DIR / "vllm", PEERS_DIR / "nanovllm"):
        sys.path.insert(0, str(root))
    return {"vllm": vsrc.describe("vllm/_version.py"),
            "nano-vllm": nsrc.describe("pyproject.toml")}
