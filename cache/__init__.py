"""hmgraph.cache: the feature file, the tiers, policies, plans, caches.

The ground floor of hmgraph: imports nothing else of the project.
"""

from hmgraph.cache.budget import check_available, format_bytes, parse_budget
from hmgraph.cache.coordinated import (
    CacheStats,
    FeatureCache,
    FrozenView,
    Layer,
)
from hmgraph.cache.feature import Feature, TensorFeature, check_ids
from hmgraph.cache.format import (
    FeatureFileError,
    FeatureFileWriter,
    open_feature_file,
    read_manifest,
    write_feature_file,
)
from hmgraph.cache.plan import CachePlan, build_cache, make_plan, replay
from hmgraph.cache.policies import POLICIES, Policy, make_policy
from hmgraph.cache.slots import SlotStore
from hmgraph.cache.storage import StorageFeature, StorageStats

__all__ = [
    "POLICIES",
    "CachePlan",
    "CacheStats",
    "Feature",
    "FeatureCache",
    "FeatureFileError",
    "FeatureFileWriter",
    "FrozenView",
    "Layer",
    "Policy",
    "SlotStore",
    "StorageFeature",
    "StorageStats",
    "TensorFeature",
    "build_cache",
    "check_available",
    "check_ids",
    "format_bytes",
    "make_plan",
    "make_policy",
    "open_feature_file",
    "parse_budget",
    "read_manifest",
    "replay",
    "write_feature_file",
]
