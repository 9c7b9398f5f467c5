"""Proving a fix: managed environments, proofs, the tree's own tests, the GPU stage."""
