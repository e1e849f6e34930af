"""Offline demo model support: synthetic data for the tiny in-repo Qwen3-VL model."""
