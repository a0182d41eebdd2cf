"""A Hugging Face Hub cache built on disk, for tests that must not touch the network.

`add_snapshot` lays files out exactly as `hf_hub_download` / `snapshot_download` leave them,
using huggingface_hub's own helpers for each piece: content-addressed blobs, a
`snapshots/<commit>/<file>` symlink per file (`_create_symlink`, relative like a download's),
`refs/<branch or tag>` files (`_cache_commit_hash_for_specific_revision`) and the cached tree
listing of the commit (`write_tree_cache`) that offline `snapshot_download` checks a snapshot
against. `huggingface_hub.scan_cache_dir` reads the result as a valid cache (tested).
"""

import hashlib
import json
import os


def add_snapshot(cache_dir, repo_id: str, files: dict[str, str | bytes], commit: str, *,
                 refs=("main",), repo_type: str = "model", not_downloaded=()) -> str:
  """Adds one commit of `repo_id` to the cache; returns its snapshot directory.

  Args:
    cache_dir: the Hub cache (what HF_HUB_CACHE names).
    repo_id: "org/name".
    files: path in the repo -> a local file to copy, or the bytes themselves.
    commit: a 40-hex-digit commit hash.
    refs: branch or tag names that point at this commit (a later call may move them).
    repo_type: "model" or "dataset".
    not_downloaded: files of `files` that the commit's tree listing names but the snapshot
      lacks, as a download restricted by `allow_patterns` leaves them.
  """
  # pylint: disable=import-outside-toplevel,protected-access
  from huggingface_hub import _tree_cache
  from huggingface_hub import file_download as fd
  assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit), commit
  storage = os.path.join(os.fspath(cache_dir), fd.repo_folder_name(repo_id=repo_id,
                                                                    repo_type=repo_type))
  entries = {}
  for rel, content in files.items():
    if not isinstance(content, bytes):
      with open(content, "rb") as f:
        content = f.read()
    sha256 = hashlib.sha256(content).hexdigest()
    git_sha1 = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    lfs = rel.endswith((".safetensors", ".parquet", ".bin"))
    entries[rel] = _tree_cache.TreeCacheEntry(
        size=len(content), blob_id=git_sha1, lfs_sha256=sha256 if lfs else None,
        lfs_size=len(content) if lfs else None)
    if rel in not_downloaded:
      continue
    etag = sha256 if lfs else git_sha1  # what the Hub's ETag is for LFS / regular files
    blob = os.path.join(storage, "blobs", etag)
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    if not os.path.exists(blob):
      with open(blob, "wb") as f:
        f.write(content)
    pointer = fd._get_pointer_path(storage, commit, rel)
    os.makedirs(os.path.dirname(pointer), exist_ok=True)
    fd._create_symlink(blob, pointer, new_blob=False)
  for ref in refs:
    fd._cache_commit_hash_for_specific_revision(storage, ref, commit)
  _tree_cache.write_tree_cache(storage, commit, entries)
  return os.path.join(storage, "snapshots", commit)


def dir_files(directory) -> dict[str, str]:
  """Every file under `directory`, keyed by its path relative to it."""
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      out[os.path.relpath(path, directory)] = path
  return out


# A tiny word-level tokenizer; its chat template just echoes the first message.
TOKENS = ["<pad>", "<s>", "</s>", "[UNK]", "what", "is", "two", "plus", "three", "?"]


def tiny_checkpoint(path, seed: int):
  """A tiny random Qwen2 HF directory (transformers' writer) with tokenizer files.

  128 embedding rows (the char tokenizer's 99 ids fit), a word-level tokenizer over
  `TOKENS`, and a `pytorch_model.bin` that a repo may carry but a download never needs.
  Returns the transformers model.
  """
  # pylint: disable=import-outside-toplevel
  import tokenizers
  import torch
  import transformers
  import tiny_hf
  torch.manual_seed(seed)
  cfg = tiny_hf.hf_config("qwen2_tied")
  cfg.vocab_size = 128
  model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {t: i for i, t in enumerate(TOKENS)}, "[UNK]"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.add_special_tokens(TOKENS[:4])
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
               "eos_token": "</s>", "chat_template": "{{ messages[0]['content'] }}"}, f)
  with open(os.path.join(path, "pytorch_model.bin"), "wb") as f:
    f.write(b"torch weights")
  return model
