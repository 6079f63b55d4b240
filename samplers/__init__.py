"""hmgraph.samplers: cluster sampling, renumbering, presampling."""

from hmgraph.samplers.cluster import ClusterSampler, metis_clusters
from hmgraph.samplers.presample import Profile, presample
from hmgraph.samplers.renumber import (
    cluster_permutation,
    renumber_feature_file,
    renumber_graph,
)

__all__ = [
    "ClusterSampler",
    "Profile",
    "cluster_permutation",
    "metis_clusters",
    "presample",
    "renumber_feature_file",
    "renumber_graph",
]
