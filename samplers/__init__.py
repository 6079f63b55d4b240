"""hmgraph.samplers: presampling (access profiles for cache plans)."""

from hmgraph.samplers.presample import Profile, presample

__all__ = ["Profile", "presample"]
