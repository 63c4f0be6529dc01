"""The smallest starting-model settings the demo tests build (seconds on CPU, nothing learned)."""

from searchr1.pretrain import PretrainSettings

TINY = dict(
    worlds=1,
    num_entities=40,
    markup_pages=20,
    copy_warmup_steps=2,
    steps=6,
    hidden_size=16,
    num_heads=2,
    seq_len=32,
    batch_size=2,
    vocab_size=300,
)
TINY_PRETRAIN = PretrainSettings(**TINY)
