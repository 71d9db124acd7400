"""The tiny gpt_oss geometry that tests/targets/test_gpt_oss_target.py builds random checkpoints of, and that
benchmarks/llamacpp/gpt_oss.py trains on the fixture corpus and has llama.cpp convert (tests/data/gpt-oss-tiny/,
whose llama.cpp GGUF and greedy text the tests read): 3 layers sliding / full / sliding with a window of 4,
4 experts top 2, YaRN RoPE."""

GPT_OSS = dict(model_type="gpt_oss", hidden_size=64, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"], tie_word_embeddings=False,
               rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0})
