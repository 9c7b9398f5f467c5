"""deepstack-patch: backport curated upstream vLLM fixes into pinned source trees."""

__version__ = "0.1.0"
