"""``tiny-llm``: a generative model made in seconds, for tests and for trying the generation
path on any machine. A 6-layer Llama with random weights (seeded) and a byte-level BPE
tokenizer trained on a few sentences; its output is noise, its shapes and code paths are
those of SmolLM2."""

from __future__ import annotations

from pathlib import Path

NAME = "tiny-llm"
DESCRIPTION = "6-layer random Llama (64 wide) with a byte-level BPE tokenizer: for tests"
EOS = "<|endoftext|>"
SEED = 0
CORPUS = (
    ("The quick brown fox jumps over the lazy dog. Once upon a time there was a small model "
     "that answered questions about the weather, the sea and the stars."),
    "def add(x, y):\n    \"\"\"Return the sum of x and y.\"\"\"\n    return x + y\n",
    "A serving system routes requests to workers, batches them and answers each one once.",
)


def tokenizer():
    """The byte-level BPE tokenizer (any text encodes; ids below ``len(tokenizer)``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(CORPUS), trainers.BpeTrainer(
        vocab_size=384, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def config(vocab: int, layers: int = 6):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=True, max_position_embeddings=512,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def model(vocab: int, layers: int = 6):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    return LlamaForCausalLM(config(vocab, layers)).eval()


def save(folder: Path) -> Path:
    """Write the model and tokenizer as a transformers folder (what preparation caches)."""
    tok = tokenizer()
    net = model(len(tok))
    net.generation_config.eos_token_id = tok.eos_token_id
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
