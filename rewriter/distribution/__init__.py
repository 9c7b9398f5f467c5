"""What a distributor takes away.

Commits, quilt/DEP-3 series, sdists, wheels, the matrix, CI pipelines, the
SBOM and the provenance statement.
"""
