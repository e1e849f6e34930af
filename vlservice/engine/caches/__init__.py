"""What the engine keeps between requests: vision features (memory + disk), conversations' KV
caches (prefix), and whole answers to identical greedy requests (results)."""

from .features import FeatureCache, feature_key
from .prefix import PrefixCache
from .results import ResultCache

__all__ = ["FeatureCache", "feature_key", "PrefixCache", "ResultCache"]
