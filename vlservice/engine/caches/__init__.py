"""What the engine keeps between requests: vision features (memory + disk), conversations' KV
caches (prefix), and whole answers to identical greedy requests (results); the first and the
last also in Redis, shared by replicas (shared)."""

from .features import FeatureCache, FeatureShape, feature_key
from .prefix import PrefixCache
from .results import ResultCache
from .shared import SharedStore

__all__ = ["FeatureCache", "FeatureShape", "feature_key", "PrefixCache", "ResultCache", "SharedStore"]
