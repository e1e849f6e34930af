"""The models' runners and their weights: checkpoints found (`checkpoints`), quantised (`quant`),
exported, and loaded once as the language-model runner (`runners.load_lm`, the `lm.LMRunner` every
setting implements: `lm`, `ortdecode`) and the vision encoder (`vision.load_encoder`); the KV cache
they fill (`kv`) and the prompt as the model's inputs (`inputs`)."""
