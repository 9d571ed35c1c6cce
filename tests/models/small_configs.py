"""The sizes of the one-layer models that tests/models builds from a Transformers config (any
family that takes these keys): small enough to build in milliseconds, large enough for 4 heads."""

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
