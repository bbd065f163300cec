#!/usr/bin/env python3
"""Build a tiny random-weight Llama plus tokenizer, fully offline and deterministically.

    python tiny_model.py OUT_DIR [--dtype bfloat16|float32] [--vocab 2048]

Run it with the vLLM venv's python (it needs torch, transformers and tokenizers):

    "$(tests/realvllm/install.sh)/bin/python" tests/realvllm/tiny_model.py /tmp/tiny-llama

The result is a normal Hugging Face model directory (config.json,
generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, chat_template.jinja) that `vllm serve OUT_DIR` loads
with HF_HUB_OFFLINE=1.  Its outputs are random token soup; it exists so that a
real vLLM engine (scheduler, KV cache, metrics) can run on a CPU-only box.

Nothing here touches the network: the tokenizer is a byte-level BPE trained on
text generated from a fixed seed, the weights come from torch.manual_seed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # deterministic + gentle on CPU

SEED = 20240611
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_BASE_TEXT = """\
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
A Kubernetes operator watches custom resources and reconciles the cluster toward the
desired state. The autoscaler reads Prometheus metrics from each vLLM replica: the
number of running and waiting requests, the KV cache usage, the time to first token
and the inter-token latency. When the queue grows, it adds replicas; when the load
falls, it removes them after a stabilization window. Hello, world! What is 2 + 2?
user assistant system: You are a helpful assistant. Tell me a story about a robot.
0 1 2 3 4 5 6 7 8 9 10 100 1000 {"key": "value", "list": [1, 2, 3]} <tag/> a=b&c=d
"""


# Frequent English words: each becomes one token (with its leading space), so that
# ordinary prompts cost about 1.3 tokens a word, as with a real Llama tokenizer.
_COMMON_WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one
have this from or had by word but what some we can out other were all there when up
use your how said an each she which do their time if will way about many then them
write would like so these her long make thing see him two has look more day could go
come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little
only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right
boy old too same tell does set three want air well also play small end put home read
hand port large spell add even land here must big high such follow act why ask men
change went light kind off need house picture try us again animal point mother world
near build self earth father head stand own page should country found answer school
grow study still learn plant cover food sun four between state keep eye never last let
thought city tree cross farm hard start might story saw far sea draw left late run
while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter
until mile river car feet care second book carry took science eat room friend began
idea fish mountain stop once base hear horse cut sure watch color face wood main
request token model server cache queue replica latency metric load scale pod node
""".split()  # noqa: SIM905 (a word list reads better as text)


def _corpus(n_lines: int = 6000) -> list[str]:
    """Deterministic pseudo-English text: the base text, common words, numbers and
    generated words (for sub-word merges), all from a fixed seed."""
    rng = random.Random(SEED)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "br", "ch", "cl", "dr", "gr", "pl", "pr", "sh", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "ng", "ck", "st", "nd"]
    made_up = sorted({
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.randint(1, 3)))
        for _ in range(4000)
    })

    def token() -> str:
        r = rng.random()
        if r < 0.55:
            return rng.choice(_COMMON_WORDS)
        if r < 0.75:
            return str(rng.randint(0, 999))       # numbers: 1-3 digit merges
        if r < 0.85:                               # identifiers such as item42
            return rng.choice(_COMMON_WORDS) + str(rng.randint(0, 999))
        return rng.choice(made_up)

    lines = _BASE_TEXT.splitlines()
    for _ in range(n_lines):
        sent = " ".join(token() for _ in range(rng.randint(4, 16)))
        lines.append(sent[:1].upper() + sent[1:] + rng.choice([".", "?", "!", ",", ";"]))
    return lines


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", bos_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer, dtype_name: str):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype_name]
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # exactly the tokenizer's size: no undecodable ids
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,      # GQA, head_dim = 32 (vLLM CPU attention supports 32)
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(dtype)
    model.eval()
    if hasattr(model.config, "dtype"):
        model.config.dtype = dtype        # transformers >= 4.56
    else:
        model.config.torch_dtype = dtype  # older transformers
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
    )
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    ap.add_argument("--vocab", type=int, default=4096, help="target BPE vocab size (upper bound)")
    args = ap.parse_args(argv)

    import torch
    torch.set_num_threads(1)  # small model; keep CPU use modest and results reproducible

    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(args.vocab)
    model = build_model(tokenizer, args.dtype)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    n_params = sum(p.numel() for p in model.parameters())
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()[:16]
    summary = {
        "out_dir": str(out.resolve()),
        "architecture": "LlamaForCausalLM",
        "vocab_size": len(tokenizer),
        "params": n_params,
        "dtype": args.dtype,
        "model.safetensors sha256[:16]": digest,
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
