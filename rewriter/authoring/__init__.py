"""Authoring a derived patch: ``derive`` turns an upstream diff into data.

It reads the diff (:mod:`.unified_diff`) and its base (:mod:`.sources`, or
a commit's parent in :mod:`.commit`), finds the units it changes with the
engine (``engine/derived``), checks the patch on its base before anything
is written (:mod:`.check`) and writes the data file (:mod:`.derive`). The
engine reads that file; nothing here runs when a patch is applied.
"""
